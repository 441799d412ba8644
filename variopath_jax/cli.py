"""The ``variopath`` command line. Every command takes ``--json`` and then prints exactly one JSON
document on stdout (human-readable tables otherwise); errors go to stderr with exit status 2."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from variopath_jax import workloads
from variopath_jax.baselines.nccl import P2P_LEVELS
from variopath_jax.bench.command import add_bench_parser
from variopath_jax.errors import VarioPathError
from variopath_jax.sim import DEFAULT_COALESCE, NetworkModel, load_network
from variopath_jax.topology import LinkDefaults, PathModel, Topology, load_topology, nvsmi, spec
from variopath_jax.topology.paths import NIC_POLICIES, load_path_profile

_UNITS = {
    "": 1,
    "b": 1,
    "kib": 1 << 10,
    "mib": 1 << 20,
    "gib": 1 << 30,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
}


def parse_size(text: str) -> int:
    """Bytes from ``4096``, ``32KiB``, ``1.5MiB``, ``2GB``."""
    s = text.strip().lower().replace(" ", "")
    num = s.rstrip("kmgib")
    unit = s[len(num) :]
    if unit not in _UNITS or not num:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (examples: 4096, 32KiB, 16MiB)")
    value = float(num) * _UNITS[unit]
    if value < 0 or value != int(value):
        raise argparse.ArgumentTypeError(f"not a whole, non-negative number of bytes: {text!r}")
    return int(value)


Handler = Callable[[argparse.Namespace], dict[str, Any]]


def _topology_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "source", help="preset name, 'sysfs', or a file (spec JSON, NCCL XML, nvidia-smi topo -m)"
    )
    _topology_options(p)


def _topology_options(p: argparse.ArgumentParser) -> None:
    d = LinkDefaults()
    p.add_argument("--nodes", type=int, default=None, help="replicate to K identical nodes")
    p.add_argument("--format", dest="fmt", default=None, help="force the source format")
    p.add_argument(
        "--pcie-gen",
        type=int,
        default=d.pcie_gen,
        help=f"PCIe generation when the source has none (default {d.pcie_gen})",
    )
    p.add_argument(
        "--pcie-width",
        type=int,
        default=d.pcie_width,
        help=f"PCIe link width (default x{d.pcie_width})",
    )
    p.add_argument(
        "--nic-gbps",
        type=float,
        default=d.nic_gbps,
        help=f"NIC line rate in Gb/s (default {d.nic_gbps:g})",
    )
    p.add_argument(
        "--inter-socket-gbs",
        type=float,
        default=d.inter_socket_gbs,
        help=f"inter-socket link, GB/s per direction (default {d.inter_socket_gbs:g})",
    )
    p.add_argument(
        "--p2p",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="override GPU peer-to-peer",
    )
    p.add_argument(
        "--gdr", action=argparse.BooleanOptionalAction, default=None, help="override GPUDirect RDMA"
    )
    p.add_argument(
        "--nic-policy", choices=NIC_POLICIES, default="nearest", help="which NICs a GPU may use"
    )


def load_from_args(args: argparse.Namespace, source: str | None = None) -> Topology:
    defaults = LinkDefaults(
        pcie_gen=args.pcie_gen,
        pcie_width=args.pcie_width,
        nic_gbps=args.nic_gbps,
        inter_socket_gbs=args.inter_socket_gbs,
    )
    return load_topology(
        source or args.source,
        args.nodes,
        fmt=args.fmt,
        defaults=defaults,
        p2p=args.p2p,
        gdr=args.gdr,
    )


def _path_profile_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--path-profile",
        default=None,
        metavar="FILE",
        help="plan with measured or hand-set path rates: a JSON path profile "
        "(per-class efficiency and GB/s caps; docs/topology.md 'Path profiles')",
    )


def path_model_from_args(args: argparse.Namespace, topo: Topology) -> PathModel:
    """The path model a command plans with: the topology's paths under ``--nic-policy``, rated
    by ``--path-profile`` when one is given."""
    profile = getattr(args, "path_profile", None)
    if profile is None:
        return PathModel(topo, nic_policy=args.nic_policy)
    return load_path_profile(profile).model(topo, nic_policy=args.nic_policy)


# ----- topo --------------------------------------------------------------------------------
def cmd_topo_show(args: argparse.Namespace) -> dict[str, Any]:
    topo = load_from_args(args)
    model = PathModel(topo, nic_policy=args.nic_policy)
    node = topo.node
    return {
        "name": topo.name,
        "fingerprint": topo.fingerprint,
        "nodes": topo.nodes,
        "gpus": topo.num_ranks,
        "nics": topo.nodes * topo.nics_per_node,
        "switches": topo.nodes * len(node.of_kind("switch")),
        "sockets": topo.nodes * len(node.of_kind("cpu")),
        "p2p": topo.p2p,
        "gdr": topo.gdr,
        "oversubscription": topo.oversubscription,
        "links": len(topo.graph.links),
        "groups": [list(g) for g in model.groups],
        "group_size": model.group_size,
        "relations": topo.relations(),
        "nic_relations": topo.nic_relations(),
        "paths": model.class_counts(),
    }


def _human_topo_show(out: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    console.print(
        f"[bold]{out['name']}[/bold]  fingerprint {out['fingerprint']}  "
        f"{out['nodes']} node(s), {out['gpus']} GPUs, {out['nics']} NICs, {out['switches']} switches, "
        f"p2p={out['p2p']} gdr={out['gdr']}"
    )
    per_node = out["gpus"] // out["nodes"]
    nics_per_node = out["nics"] // out["nodes"]
    table = Table(title="node 0: nvidia-smi topo -m classes")
    table.add_column("")
    for j in range(per_node):
        table.add_column(f"GPU{j}")
    for k in range(nics_per_node):
        table.add_column(f"NIC{k}")
    for i in range(per_node):
        table.add_row(
            f"GPU{i}", *out["relations"][i][:per_node], *out["nic_relations"][i][:nics_per_node]
        )
    console.print(table)
    console.print(f"rank groups (size {out['group_size']}): {out['groups']}")
    console.print(
        "candidate paths per class: " + ", ".join(f"{k} {v}" for k, v in out["paths"].items())
    )


def cmd_topo_convert(args: argparse.Namespace) -> dict[str, Any]:
    topo = load_from_args(args)
    text = spec.dumps(topo) if args.to == "spec" else nvsmi.render(topo)
    if args.output:
        Path(args.output).write_text(text)
    elif not args.json:
        sys.stdout.write(text)
    result: dict[str, Any] = {
        "format": args.to,
        "fingerprint": topo.fingerprint,
        "output": args.output,
    }
    if not args.output:
        result["text"] = text
    return result


# ----- run / demo -------------------------------------------------------------------------
def _workload_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("workload")
    src = g.add_mutually_exclusive_group(required=True)
    src.add_argument("--workload", choices=sorted(workloads.WORKLOADS), help="generate a demand")
    src.add_argument("--demand", help="load a demand matrix (.npy or CSV)")
    g.add_argument(
        "--drop-self",
        action="store_true",
        help="zero a loaded matrix's diagonal (self traffic is local)",
    )
    g.add_argument(
        "--bytes-per-pair",
        type=parse_size,
        default=1 << 20,
        help="uniform: bytes per pair (default 1MiB)",
    )
    g.add_argument("--tokens", type=int, default=128, help="moe: tokens per rank M (default 128)")
    g.add_argument("--experts", type=int, default=256, help="moe: experts (default 256)")
    g.add_argument("--top-k", type=int, default=8, help="moe: experts per token (default 8)")
    g.add_argument("--hidden", type=int, default=7168, help="moe: hidden size (default 7168)")
    g.add_argument(
        "--dtype-bytes", type=int, default=2, help="moe/sp: bytes per element (default 2, bf16)"
    )
    g.add_argument("--skew", type=float, default=0.6, help="zipf: skewness s (default 0.6)")
    g.add_argument(
        "--bytes-per-rank",
        type=parse_size,
        default=32 << 20,
        help="zipf: mean bytes per rank (default 32MiB)",
    )
    g.add_argument(
        "--heads-parallel", type=int, default=None, help="sp: H (default: GPUs per node)"
    )
    g.add_argument("--seq-len", type=int, default=75600, help="sp: sequence length (default 75600)")
    g.add_argument("--num-heads", type=int, default=40, help="sp: attention heads (default 40)")
    g.add_argument("--head-dim", type=int, default=128, help="sp: head dimension (default 128)")


def make_demand(args: argparse.Namespace, topo: Topology) -> tuple[np.ndarray, dict[str, Any]]:
    n = topo.num_ranks
    if args.demand:
        return workloads.load_demand(args.demand, n, args.drop_self), {"demand": args.demand}
    name = args.workload
    if name == "uniform":
        return workloads.uniform(n, args.bytes_per_pair), {
            "workload": name,
            "bytes_per_pair": args.bytes_per_pair,
        }
    if name == "moe":
        d = workloads.moe(
            n,
            args.tokens,
            experts=args.experts,
            top_k=args.top_k,
            hidden=args.hidden,
            dtype_bytes=args.dtype_bytes,
            seed=args.seed,
        )
        return d, {
            "workload": name,
            "tokens": args.tokens,
            "experts": args.experts,
            "top_k": args.top_k,
        }
    if name == "zipf":
        d = workloads.zipf(n, args.skew, args.bytes_per_rank, seed=args.seed)
        return d, {"workload": name, "skew": args.skew, "bytes_per_rank": args.bytes_per_rank}
    h = args.heads_parallel or topo.gpus_per_node
    if n % h:
        raise workloads.DemandError(f"sp: H={h} does not divide {n} ranks")
    d = workloads.sp(
        h,
        n // h,
        seq_len=args.seq_len,
        num_heads=args.num_heads,
        head_dim=args.head_dim,
        dtype_bytes=args.dtype_bytes,
    )
    return d, {"workload": name, "heads_parallel": h, "context_parallel": n // h}


def _planner_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("VarioPath planner")
    g.add_argument(
        "--k-target",
        type=int,
        default=None,
        help="target rounds K (default N; the paper uses N..3N)",
    )
    g.add_argument(
        "--starts", type=int, default=4, help="Alternating Algorithm starts N_start (default 4)"
    )
    g.add_argument(
        "--sweeps", type=int, default=3, help="Alternating Algorithm sweeps I_AA (default 3)"
    )
    g.add_argument(
        "--granularity",
        choices=("auto", "fixed"),
        default="auto",
        help="auto: fewer rounds when λ dominates (default); fixed: exactly K_target's quantum",
    )
    g.add_argument(
        "--planner", choices=("cpp", "python"), default="cpp", help="C++ core or Python reference"
    )
    peers = p.add_argument_group("peer schedulers")
    peers.add_argument(
        "--nccl-p2p-level",
        type=str.upper,
        choices=P2P_LEVELS,
        default=None,
        help="nccl: NCCL_P2P_LEVEL, the farthest path class that uses P2P "
        "(default NCCL's own rule, PXB; beyond it, host memory)",
    )


def _planner_dict(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "k_target": args.k_target,
        "starts": args.starts,
        "sweeps": args.sweeps,
        "granularity": args.granularity,
        "planner": args.planner,
        "nccl_p2p_level": args.nccl_p2p_level,
    }


def _model_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--seed", type=int, default=0, help="seed of the workload and the planner")
    _network_options(p)


def _network_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--contention",
        default="pcie",
        help="network model: pcie (calibrated contention, the default), none (ideal sharing) "
        "or a JSON file of measured parameters (docs/simulator.md)",
    )
    p.add_argument(
        "--lambda-us",
        type=float,
        default=None,
        help="barrier cost λ in µs, planned with and charged (default: the network model's)",
    )


def network_from_args(args: argparse.Namespace) -> NetworkModel:
    """The network model named by ``--contention``, with ``--lambda-us`` applied."""
    network = load_network(args.contention)
    if args.lambda_us is not None:
        if not args.lambda_us >= 0:
            raise VarioPathError(f"--lambda-us must be >= 0, got {args.lambda_us}")
        network = network.replace(barrier_s=args.lambda_us * 1e-6)
    return network


def _network_summary(network: NetworkModel) -> dict[str, Any]:
    return {"contention": network.name, "lambda_us": network.barrier_s * 1e6}


def _sim_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--coalesce",
        type=float,
        default=DEFAULT_COALESCE,
        help=f"simulator event-coalescing tolerance ε (default {DEFAULT_COALESCE:g}; 0 = exact)",
    )


def cmd_run(args: argparse.Namespace) -> dict[str, Any]:
    from variopath_jax.runner import run_one

    topo = load_from_args(args, args.topology)
    model = path_model_from_args(args, topo)
    demand, workload = make_demand(args, topo)
    network = network_from_args(args)
    result = run_one(
        model,
        args.scheduler,
        demand,
        network=network,
        seed=args.seed,
        options=_planner_dict(args),
        coalesce=args.coalesce,
    )
    if args.save_schedule:
        result.schedule.save(args.save_schedule)
    out = {"topology": topo.name, "fingerprint": topo.fingerprint, **workload, **result.summary()}
    out |= _network_summary(network)
    out["modeled_s"] = result.schedule.modeled_time()
    return out


def cmd_plan(args: argparse.Namespace) -> dict[str, Any]:
    import time as _time

    from variopath_jax.schedule import validate
    from variopath_jax.schedulers import PlanRequest, get_scheduler
    from variopath_jax.sim import FluidSimulator

    topo = load_from_args(args, args.topology)
    model = path_model_from_args(args, topo)
    demand, workload = make_demand(args, topo)
    network = network_from_args(args)
    request = PlanRequest(demand, model, network.barrier_s, args.seed, _planner_dict(args), network)
    start = _time.perf_counter()
    schedule = get_scheduler(args.scheduler).plan(request)
    total_s = _time.perf_counter() - start
    plan_s = schedule.meta.get("plan_s", total_s)  # the planner's own time, when it keeps one
    check = validate(schedule, demand, topo)
    predicted = FluidSimulator(topo, network).run(schedule) if check.ok else None
    if args.save_schedule:
        schedule.save(args.save_schedule)
    steps = len(schedule.steps)
    return {
        "topology": topo.name,
        "fingerprint": topo.fingerprint,
        **workload,
        "scheduler": args.scheduler,
        "ranks": topo.num_ranks,
        "total_bytes": int(demand.sum()),
        "steps": steps,
        "activations": steps,
        "transfers": schedule.num_transfers,
        "valid": check.ok,
        "errors": list(check.errors),
        "plan_s": plan_s,
        "setup_s": total_s - plan_s,
        "plan_us_per_activation": plan_s / steps * 1e6 if steps else 0.0,
        "plan_over_comm": plan_s / predicted.completion_s if predicted else None,
        "modeled_s": schedule.modeled_time(),
        "predicted_s": predicted.completion_s if predicted else None,
        "predicted_algbw_gbps": predicted.algbw_gbps if predicted else None,
        **_network_summary(network),
        "saved": args.save_schedule,
    }


def _human_plan(out: dict[str, Any]) -> None:
    print(
        f"{out['scheduler']} on {out['topology']} ({out['ranks']} ranks): {out['activations']} activations, "
        f"modeled {out['modeled_s'] * 1e3:.3f} ms (Eq. 2), "
        + (
            f"predicted {out['predicted_s'] * 1e3:.3f} ms under {out['contention']}, "
            if out["predicted_s"] is not None
            else ""
        )
        + f"planned in {out['plan_s'] * 1e3:.2f} ms "
        f"({out['plan_us_per_activation']:.1f} µs/activation"
        + (f", O/C {out['plan_over_comm']:.1%}" if out["plan_over_comm"] is not None else "")
        + f"; catalog and setup {out['setup_s'] * 1e3:.1f} ms), valid={out['valid']}"
        + (f", saved to {out['saved']}" if out["saved"] else "")
    )


def _human_run(out: dict[str, Any]) -> None:
    print(
        f"{out['scheduler']} on {out['topology']} ({out['ranks']} ranks): {out['steps']} steps, "
        f"{out['transfers']} transfers, {out['total_bytes'] / 2**20:.2f} MiB in {out['completion_s'] * 1e3:.3f} ms "
        f"= {out['algbw_gbps']:.2f} GB/s algbw under {out['contention']}; "
        f"planned in {out['plan_s'] * 1e3:.2f} ms; "
        f"valid={out['valid']}"
    )
    for e in out["errors"][:5]:
        print("  invalid:", e)


def cmd_simulate(args: argparse.Namespace) -> dict[str, Any]:
    from variopath_jax.schedule import Schedule, validate
    from variopath_jax.sim import FluidSimulator

    topo = load_from_args(args, args.topology)
    schedule = Schedule.load(args.schedule)
    demand = (
        workloads.load_demand(args.demand, topo.num_ranks) if args.demand else schedule.served()
    )
    validate(schedule, demand, topo).raise_if_invalid()
    network = network_from_args(args)
    sim = FluidSimulator(topo, network, coalesce=args.coalesce).run(schedule)
    return {
        **_network_summary(network),
        "scheduler": schedule.meta.get("scheduler", "?"),
        "ranks": schedule.ranks,
        "total_bytes": sim.total_bytes,
        "completion_s": sim.completion_s,
        "algbw_gbps": sim.algbw_gbps,
        "steps": len(schedule.steps),
        "transfers": schedule.num_transfers,
        "valid": True,
        "errors": [],
        "plan_s": 0.0,
        "topology": topo.name,
    }


def cmd_demo(args: argparse.Namespace) -> dict[str, Any]:
    from variopath_jax.bench.plots import plot_link_utilisation
    from variopath_jax.runner import run_one
    from variopath_jax.schedulers import scheduler_names
    from variopath_jax.sim import NONE, FluidSimulator
    from variopath_jax.solver.bound import lower_bound

    topo = load_topology("r5080-bf3", 2)
    model = PathModel(topo)
    demand = workloads.moe(topo.num_ranks, args.tokens, seed=args.seed)
    network = load_network(args.contention)
    ideal = NONE.replace(barrier_s=network.barrier_s)
    bound_s = lower_bound(demand, topo).best_s
    rows, results = [], {}
    for name in scheduler_names():
        res = run_one(model, name, demand, network=network, seed=args.seed, record_links=True)
        results[name] = res
        row = {k: v for k, v in res.summary().items() if k != "errors"}
        none = FluidSimulator(topo, ideal).run(res.schedule)
        row |= {
            "bound_fraction": bound_s / res.sim.completion_s,
            "none_completion_s": none.completion_s,
            "none_algbw_gbps": none.algbw_gbps,
            "none_bound_fraction": bound_s / none.completion_s,
        }
        rows.append(row)
    best = max(rows, key=lambda r: r["algbw_gbps"])["scheduler"]
    png = plot_link_utilisation(
        results[best].sim,
        topo,
        Path(args.out) / f"link_utilisation_{best}.png",
        f"{best} on r5080-bf3 ×2, MoE M={args.tokens}, {network.name} model: link utilisation",
    )
    # the JAX op on 8 CPU devices, checked against NumPy
    if "jax" not in sys.modules:
        os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
    from variopath_jax.jax_ops import selfcheck

    check = selfcheck.run(devices=8)
    if not check["ok"]:
        raise VarioPathError(f"all_to_all_v self-check failed: {check}")
    return {
        "topology": "r5080-bf3",
        "nodes": 2,
        "workload": "moe",
        "tokens": args.tokens,
        "contention": network.name,
        "bound_s": bound_s,
        "results": rows,
        "best": best,
        "plot": str(png),
        "jax_check": check,
    }


def _human_demo(out: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    model = out["contention"]
    table = Table(
        title=f"MoE AlltoAllv (M={out['tokens']} tokens/rank) on r5080-bf3 × 2 nodes, simulated "
        f"under the {model} model and the ideal one (none)",
        caption="LB = the LP lower bound's time / completion time (100% is optimal); "
        "* = invalid schedule",
    )
    table.add_column("scheduler", no_wrap=True)
    for col in ("steps", f"{model} ms", "GB/s", "LB", "none ms", "GB/s", "LB"):
        table.add_column(col, justify="right")
    for r in sorted(out["results"], key=lambda r: -r["algbw_gbps"]):
        table.add_row(
            r["scheduler"] + ("" if r["valid"] else " *"),
            str(r["steps"]),
            f"{r['completion_s'] * 1e3:.3f}",
            f"{r['algbw_gbps']:.2f}",
            f"{r['bound_fraction']:.0%}",
            f"{r['none_completion_s'] * 1e3:.3f}",
            f"{r['none_algbw_gbps']:.2f}",
            f"{r['none_bound_fraction']:.0%}",
        )
    Console().print(table)
    print(f"link utilisation of the best ({out['best']}): {out['plot']}")
    c = out["jax_check"]
    print(
        f"all_to_all_v on {c['devices']} CPU devices: {c['rows_moved']} rows exchanged, matches NumPy "
        f"({c['seconds'] * 1e3:.0f} ms including compilation)"
    )


# ----- solver ----------------------------------------------------------------------------
def cmd_gap(args: argparse.Namespace) -> dict[str, Any]:
    from variopath_jax.solver.gap import run_gap, summarize

    topo = load_from_args(args, args.topology)
    sizes = [float(x) for x in args.sizes.split(",") if x]
    if not sizes or min(sizes) <= 0 or args.seeds < 1:
        raise VarioPathError("--sizes needs positive MiB values and --seeds at least 1")
    progress = None
    if not args.json and sys.stderr.isatty():
        from rich.progress import Progress

        bar = Progress(transient=True)
        task = bar.add_task("instances", total=len(sizes) * args.seeds)
        bar.start()

        def progress(label: str) -> None:
            bar.update(task, description=label, advance=1)

    try:
        rows = run_gap(
            topo,
            sizes,
            args.seeds,
            skew=args.skew,
            time_limit_s=args.time_limit,
            backend=args.backend,
            coalesce=args.coalesce,
            network=network_from_args(args),
            progress=progress,
        )
    finally:
        if progress is not None:
            bar.stop()
    return {
        "topology": topo.name,
        "nodes": topo.nodes,
        "skew": args.skew,
        **_network_summary(network_from_args(args)),
        **summarize(rows),
    }


def _human_gap(out: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(
        title=f"VarioPath vs MILP on {out['topology']} x {out['nodes']} (Zipf {out['skew']})"
    )
    for col in ("MiB/rank", "seeds", "mean VP/MILP", "worst", "certified", "MILP gap", "VP/bound"):
        table.add_column(col, justify="right")
    for size, st in out["by_size"].items():
        table.add_row(
            size,
            str(st["instances"]),
            f"{st['mean_ratio']:.2%}",
            f"{st['worst_ratio']:.2%}",
            f"{st['certified']}/{st['instances']}",
            f"{st['mean_milp_gap']:.2%}",
            f"{st['mean_variopath_of_bound']:.2%}",
        )
    ov = out["overall"]
    table.add_row(
        "all",
        str(ov["instances"]),
        f"{ov['mean_ratio']:.2%}",
        f"{ov['worst_ratio']:.2%}",
        f"{ov['certified']}/{ov['instances']}",
        f"{ov['mean_milp_gap']:.2%}",
        f"{ov['mean_variopath_of_bound']:.2%}",
    )
    Console().print(table)
    print("paper (Figure 12): mean 99.18%, worst 91.92%, every instance certified optimal")


# ----- catalog ---------------------------------------------------------------------------
def cmd_catalog_build(args: argparse.Namespace) -> dict[str, Any]:
    from variopath_jax.catalog import build_catalog, store

    topo = load_from_args(args)
    progress = None
    if not args.json and sys.stderr.isatty():
        from rich.progress import Progress

        bar = Progress(transient=True)
        task = bar.add_task("families", total=None)
        bar.start()

        def progress(found: int) -> None:
            bar.update(task, completed=found)

    try:
        cat = build_catalog(
            topo,
            args.kind,
            args.method,
            args.nic_policy,
            max_families=args.max_families,
            progress=progress,
        )
    finally:
        if progress is not None:
            bar.stop()
    out = {"topology": topo.name, "nodes": topo.nodes, **cat.summary()}
    if args.out:
        out["bytes"] = store.save(cat, args.out)
        out["file"] = args.out
    else:
        out["bytes"] = len(store.dumps(cat))
    return out


def cmd_catalog_show(args: argparse.Namespace) -> dict[str, Any]:
    from variopath_jax.catalog import store

    cat = store.load(args.file)
    out = cat.summary()
    out["bytes"] = Path(args.file).stat().st_size
    out["file"] = args.file
    return out


def _human_catalog(out: dict[str, Any]) -> None:
    where = f" -> {out['file']}" if out.get("file") else ""
    print(
        f"{out['kind']} catalog{where}: fingerprint {out['fingerprint']}, {len(out['groups'])} groups of "
        f"{out['group_size']}, {out['instances']} instances, {out['shapes']} shapes, {out['families']} families, "
        f"{out['bytes'] / 1024:.1f} KiB, built in {out['seconds']:.2f} s ({out['method']})"
    )


def cmd_catalog_verify(args: argparse.Namespace) -> dict[str, Any]:
    import variopath_jax.solver.verify  # noqa: F401  (registers the CP-SAT verifier)
    from variopath_jax.catalog import VERIFIERS, build_catalog

    topo = load_from_args(args)
    if args.verifier not in VERIFIERS:
        raise VarioPathError(
            f"unknown verifier {args.verifier!r}; available: {', '.join(sorted(VERIFIERS))}"
        )
    model = PathModel(topo, nic_policy=args.nic_policy)
    cat = build_catalog(topo, "flat", args.method, args.nic_policy)
    report = VERIFIERS[args.verifier](cat, model)
    return {
        "verifier": report.method,
        "ok": report.ok,
        "sound": report.sound,
        "complete": report.complete,
        "channels": report.channels,
        "shapes_checked": report.shapes_checked,
        "shapes": len(cat.shapes),
        "families": len(cat.families),
        "problems": report.problems,
    }


def _human_verify(out: dict[str, Any]) -> None:
    checked = (
        f"{out['shapes_checked']} admissible shapes"
        if out["verifier"] == "cpsat"
        else f"{out['channels']} feasible channels"
    )
    print(
        f"{out['verifier']}: sound={out['sound']} complete={out['complete']} ({checked}, "
        f"{out['shapes']} shapes, {out['families']} families)"
    )
    for p in out["problems"][:10]:
        print("  ", p)


def cmd_info(args: argparse.Namespace) -> dict[str, Any]:
    from variopath_jax import __version__
    from variopath_jax._native import build_info, cuda_devices

    info: dict[str, Any] = {"version": __version__, "native": build_info(), "cuda": cuda_devices()}
    info["native"]["ffi_api_version"] = list(info["native"]["ffi_api_version"])
    try:
        import jax

        info["jax"] = jax.__version__
    except ImportError:  # pragma: no cover - jax is a dependency
        info["jax"] = None
    return info


def _human_info(out: dict[str, Any]) -> None:
    native, cuda = out["native"], out["cuda"]
    print(f"variopath_jax {out['version']}  (jax {out['jax']})")
    print(
        f"native module: {native['compiler']}, C++ {native['cxx_standard']}, FFI API {native['ffi_api_version']}"
    )
    if cuda["compiled"]:
        print(
            f"CUDA parts: built with nvcc {native['cuda_compiler_version']}; devices: {cuda['device_count']}"
            + (f" ({cuda['error']})" if cuda["error"] else "")
        )
    else:
        print(f"CUDA parts: not built ({cuda['error']})")


# ----- parser ------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="variopath", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    def command(
        subparsers, name: str, handler: Handler, help: str, human=None
    ) -> argparse.ArgumentParser:
        p = subparsers.add_parser(name, help=help, description=help)
        p.add_argument("--json", action="store_true", help="print one JSON document on stdout")
        p.set_defaults(handler=handler, human=human)
        return p

    topo = sub.add_parser("topo", help="inspect and convert topologies")
    topo_sub = topo.add_subparsers(dest="topo_command", required=True)
    show = command(
        topo_sub,
        "show",
        cmd_topo_show,
        "show a topology: classes, groups, candidate paths",
        _human_topo_show,
    )
    _topology_args(show)
    conv = command(
        topo_sub, "convert", cmd_topo_convert, "convert a topology to a spec file or topo -m text"
    )
    _topology_args(conv)
    conv.add_argument("--to", choices=("spec", "nvsmi"), required=True)
    conv.add_argument("-o", "--output", default=None, help="write here instead of stdout")

    catalog = sub.add_parser("catalog", help="build, inspect and verify channel catalogs")
    cat_sub = catalog.add_subparsers(dest="catalog_command", required=True)
    build = command(
        cat_sub,
        "build",
        cmd_catalog_build,
        "build the channel-family catalog of a topology",
        _human_catalog,
    )
    _topology_args(build)
    build.add_argument("--kind", choices=("auto", "flat", "factored"), default="auto")
    build.add_argument(
        "--method",
        choices=("profiles", "dfs"),
        default="profiles",
        help="compact rate-profile search (default) or Algorithm 1's DFS",
    )
    build.add_argument("--max-families", type=int, default=2_000_000)
    build.add_argument("--out", default=None, help="write the catalog file here")
    show = command(cat_sub, "show", cmd_catalog_show, "summarise a catalog file", _human_catalog)
    show.add_argument("file")
    ver = command(
        cat_sub,
        "verify",
        cmd_catalog_verify,
        "check a small topology's catalog against a verifier",
        _human_verify,
    )
    _topology_args(ver)
    ver.add_argument(
        "--verifier", default="bruteforce", help="bruteforce or cpsat (OR-Tools CP-SAT)"
    )
    ver.add_argument("--method", choices=("profiles", "dfs"), default="profiles")

    run = command(sub, "run", cmd_run, "plan, validate and simulate one AlltoAllv call", _human_run)
    run.add_argument("--topology", required=True, help="preset name, 'sysfs', or a topology file")
    _topology_options(run)
    run.add_argument(
        "--scheduler", required=True, help="a registered scheduler (nccl, pairwise, ...)"
    )
    _workload_options(run)
    _model_options(run)
    run.add_argument("--save-schedule", default=None, help="write the schedule (JSON IR) here")
    _path_profile_option(run)
    _planner_options(run)
    _sim_options(run)

    plan = command(
        sub,
        "plan",
        cmd_plan,
        "plan and validate one AlltoAllv call; predict its time under the network model",
        _human_plan,
    )
    plan.add_argument("--topology", required=True, help="preset name, 'sysfs', or a topology file")
    _topology_options(plan)
    plan.add_argument(
        "--scheduler", default="variopath", help="a registered scheduler (default variopath)"
    )
    _workload_options(plan)
    _model_options(plan)
    plan.add_argument("--save-schedule", default=None, help="write the schedule (JSON IR) here")
    _path_profile_option(plan)
    _planner_options(plan)

    sim = command(
        sub, "simulate", cmd_simulate, "validate and simulate a saved schedule", _human_run
    )
    sim.add_argument("--topology", required=True, help="the topology the schedule was planned for")
    _topology_options(sim)
    sim.add_argument("--schedule", required=True, help="a schedule file (from run --save-schedule)")
    sim.add_argument(
        "--demand", default=None, help="the demand it must serve (default: what it serves)"
    )
    _network_options(sim)
    _sim_options(sim)

    demo = command(
        sub,
        "demo",
        cmd_demo,
        "compare every scheduler on r5080-bf3 x 2 with an MoE demand",
        _human_demo,
    )
    demo.add_argument("--tokens", type=int, default=128, help="MoE tokens per rank (default 128)")
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--out", default="out/demo", help="where the plot goes (default out/demo)")
    demo.add_argument(
        "--contention",
        default="pcie",
        help="the network model ranked by, beside the ideal one: pcie (default) or a JSON file",
    )

    gap = command(
        sub, "gap", cmd_gap, "VarioPath against the MILP optimum (paper Figure 12)", _human_gap
    )
    gap.add_argument("--topology", required=True, help="preset name, 'sysfs', or a topology file")
    _topology_options(gap)
    gap.add_argument("--sizes", default="8,16,32,64,128", help="MiB per rank, comma-separated")
    gap.add_argument("--seeds", type=int, default=5, help="Zipf demands per size (default 5)")
    gap.add_argument("--skew", type=float, default=0.6, help="Zipf factor (default 0.6)")
    gap.add_argument(
        "--time-limit", type=float, default=60.0, help="seconds per MILP solve (default 60)"
    )
    gap.add_argument(
        "--backend", default="CP-SAT", help="CP-SAT (default) or a pywraplp MIP backend: SCIP, ..."
    )
    _model_options(gap)
    _sim_options(gap)

    add_bench_parser(sub, command)

    command(sub, "info", cmd_info, "versions, native build and CUDA devices", _human_info)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        out = args.handler(args)
    except VarioPathError as err:
        if args.json:
            print(json.dumps({"error": str(err)}))
        print(f"variopath: error: {err}", file=sys.stderr)
        return 2
    if args.json:
        json.dump(out, sys.stdout)
        sys.stdout.write("\n")
    elif args.human is not None:
        args.human(out)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
