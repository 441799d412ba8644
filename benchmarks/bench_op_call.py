"""What a user gets per call of the op (issue 51 item 1): the op's plan plus the planning it pays
on its call path, against NCCL, every peer and the best plan any family reaches.

Per point and per named network model (``pcie``, ``pcie-fair``, ``none``; each at its default
barrier cost λ), all simulated by the fluid simulator at its default settings, as
``runner.run_one`` does:

- NCCL and every peer of the ``variopath bench`` suites (``nccl``, ``fast``, ``deepep``,
  ``deepep-rdma``, ``railwave``, ``msccl``; a peer that fails or plans an invalid schedule at a
  point is left out there), and the best of them (``best peer``);
- the op's plan (the ``op`` scheduler: what the JAX op runs for this demand in steady state, the
  decision made ahead from the same demand under the op's default models, ``pcie`` and
  ``pcie-fair``, whatever the judging model; ``plan``: the family it runs), its planning on the
  call path (``plan µs``: rank 0, measured cold, the median of ``--repeats`` calls each after
  ``--flush-mib`` of other memory traffic; the same for every model), its communication under
  the model (``comm``), plan + communication (``op``), ``NCCL ÷ op`` and ``best ÷ op`` (a
  peer's time over the op's plan + communication: NCCL and the peers plan nothing per call);
- the ceiling: the best plan any family reaches for that model with planning free (the
  ``variopath`` scheduler planned for that one model with ``hybrid="all"``, simulated under it),
  and ``op ÷ ceiling`` (the op's plan + communication over it; its communication alone in the
  JSON: ``op_comm_over_ceiling``);
- the LP bound (``solver.bound.lower_bound``, model-free: the flow LP where it is small enough,
  else the endpoint bound).

The suite: r5080-bf3 x 1, 2 and 8, r5080-cx8 x 2 and 8, l20-cx7 x 1 and 2, r5090-bf3 x 2, each
with MoE dispatch at M = 16, 128 and 1024 tokens per rank (``workloads.moe``, the fig suites'
DeepSeek-style routing, seed 0), uniform traffic at 1 MiB and 64 MiB per rank (as fig8) and Zipf
(s = 0.6, seed 0) at 1 GiB per rank; plus r5080-cx8 x 32 (256 GPUs) MoE M = 128 (``--skip-large``
leaves it out: its peers alone take minutes to simulate). ``--quick``: r5080-bf3 x 1 and 2 with
MoE M = 16 and 128 and uniform 64 MiB.

Prints a table per model, then per model the summary: geomeans of NCCL ÷ op, best peer ÷ op and op
÷ ceiling, the points lost to NCCL and to the best peer, the largest planning ÷ communication
among the points of 8-64 GPUs and at 256 GPUs, and the planning at r5080-bf3 x 2 MoE M = 128:
the figures of issue 51's goals. ``--json``: one JSON document instead (``settings``, ``rows``:
one per point and model, ``summary``: one per model); ``--json FILE`` writes it there and prints
the tables too. Progress goes to stderr.

Run: ``python benchmarks/bench_op_call.py [--quick] [--skip-large] [--only r5080-bf3x2,...]
[--repeats 25] [--flush-mib 64] [--json [FILE]]``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from variopath_jax import workloads
from variopath_jax.bench.suites import SUITES
from variopath_jax.planner.schedulers import OP_FLUSH_BYTES, OP_REPEATS
from variopath_jax.runner import run_one
from variopath_jax.sim import DEFAULT_COALESCE, NETWORK_MODELS, FluidSimulator, load_network
from variopath_jax.solver.bound import lower_bound
from variopath_jax.topology import PathModel, preset

# the peers of the `variopath bench` suites, in their order
PEERS = tuple(
    dict.fromkeys(
        s.scheduler
        for suite in SUITES.values()
        for s in suite.peers
        if not s.scheduler.startswith("variopath")
    )
)
DEPLOYMENTS = (
    ("r5080-bf3", 1),
    ("r5080-bf3", 2),
    ("r5080-bf3", 8),
    ("r5080-cx8", 2),
    ("r5080-cx8", 8),
    ("l20-cx7", 1),
    ("l20-cx7", 2),
    ("r5090-bf3", 2),
)
# (workload, value): MoE tokens per rank M, uniform MiB per rank, Zipf MiB per rank
WORKLOADS = (
    ("moe", 16),
    ("moe", 128),
    ("moe", 1024),
    ("uniform", 1),
    ("uniform", 64),
    ("zipf", 1024),
)
ZIPF_SKEW = 0.6  # the skew of the suites' table3 and of the CLI's default
QUICK_DEPLOYMENTS = (("r5080-bf3", 1), ("r5080-bf3", 2))
QUICK_WORKLOADS = (("moe", 16), ("moe", 128), ("uniform", 64))
TIE = 1e-9  # a ratio within this of 1 is a tie, not a loss
SMALL_RANKS = (8, 64)  # the goals' "8-64 GPUs"
LARGE_RANKS = 256
PLANNING_POINT = ("r5080-bf3", 2, "moe", 128)  # the goal of 5 µs


@dataclass(frozen=True)
class Point:
    """One demand of the suite."""

    topology: str
    nodes: int
    workload: str
    value: int

    @property
    def label(self) -> str:
        if self.workload == "moe":
            what = f"MoE M={self.value}"
        elif self.workload == "uniform":
            what = f"uniform {self.value} MiB"
        elif self.value % 1024 == 0:
            what = f"{self.workload} {self.value >> 10} GiB"
        else:
            what = f"{self.workload} {self.value} MiB"
        return f"{self.topology} x{self.nodes} {what}"

    def demand(self, ranks: int) -> np.ndarray:
        """As the fig suites make it (``bench.suites.Suite.demand``): seed 0; sizes per rank."""
        if self.workload == "moe":
            return workloads.moe(ranks, self.value, seed=0)
        if self.workload == "uniform":
            return workloads.uniform(ranks, (self.value << 20) // ranks)
        if self.workload == "zipf":
            return workloads.zipf(ranks, ZIPF_SKEW, self.value << 20, seed=0)
        raise ValueError(f"unknown workload {self.workload!r}")


def points(quick: bool = False, skip_large: bool = False) -> list[Point]:
    deployments = QUICK_DEPLOYMENTS if quick else DEPLOYMENTS
    out = [
        Point(t, n, w, v)
        for t, n in deployments
        for w, v in (QUICK_WORKLOADS if quick else WORKLOADS)
    ]
    if not quick and not skip_large:
        out.append(Point("r5080-cx8", 32, "moe", 128))
    return out


COLUMNS = (
    "point",
    "topology",
    "nodes",
    "ranks",
    "workload",
    "value",
    "total_bytes",
    "model",
    "peers_s",  # per peer: its completion under the model (None: failed or invalid there)
    "peer_errors",
    "nccl_s",
    "best_peer",
    "best_peer_s",
    "op_plan",  # the family the op runs
    "op_decision",  # the family decided ahead
    "op_plan_s",  # its planning on the call path, rank 0, cold (median)
    "op_plan_s_min",
    "op_comm_s",
    "op_total_s",
    "op_valid",
    "nccl_over_op",
    "best_peer_over_op",
    "plan_over_comm",
    "ceiling_plan",
    "ceiling_s",
    "op_over_ceiling",
    "op_comm_over_ceiling",
    "bound_s",
    "bound_kind",
    "bound_over_op",
    "wall_s",
)


def _simulate(topo, schedule, net) -> float:
    return FluidSimulator(topo, net, coalesce=DEFAULT_COALESCE).run(schedule).completion_s


def _log(verbose: bool, text: str) -> None:
    if verbose:
        print(text, file=sys.stderr, flush=True)


def measure(
    point: Point,
    models: tuple[str, ...] = tuple(NETWORK_MODELS),
    *,
    repeats: int = OP_REPEATS,
    flush_bytes: int = OP_FLUSH_BYTES,
    verbose: bool = False,
) -> list[dict[str, Any]]:
    """One row per model (``COLUMNS``) for ``point``: the peers and the op planned once and
    simulated under each model, the ceiling planned for each."""
    start = time.perf_counter()
    nets = [load_network(m) for m in models]
    if len({n.barrier_s for n in nets}) > 1:
        raise ValueError("the models of one run must share their barrier cost λ")
    topo = preset(point.topology, point.nodes)
    model = PathModel(topo)
    n = topo.num_ranks
    demand = point.demand(n)
    peers: dict[str, list[float | None]] = {}
    errors: dict[str, str] = {}
    for name in PEERS:
        t = time.perf_counter()
        try:
            res = run_one(model, name, demand, network=nets[0])
            if not res.validation.ok:
                raise ValueError("invalid: " + "; ".join(res.validation.errors[:3]))
            peers[name] = [res.sim.completion_s] + [
                _simulate(topo, res.schedule, net) for net in nets[1:]
            ]
        except Exception as err:  # a peer that cannot run here is left out of this point
            errors[name] = f"{type(err).__name__}: {err}"
            peers[name] = [None] * len(nets)
        _log(verbose, f"  {name}: {time.perf_counter() - t:.1f} s")
    t = time.perf_counter()
    op = run_one(
        model,
        "op",
        demand,
        network=nets[0],
        options={"repeats": repeats, "flush_bytes": flush_bytes},
    )
    op_comm = [op.sim.completion_s] + [_simulate(topo, op.schedule, net) for net in nets[1:]]
    meta = op.schedule.meta
    _log(verbose, f"  op ({meta['plan']}): {time.perf_counter() - t:.1f} s")
    ceilings = []
    for net in nets:
        t = time.perf_counter()
        try:
            res = run_one(model, "variopath", demand, network=net, options={"hybrid": "all"})
            ok = res.validation.ok
            ceilings.append((res.schedule.meta.get("plan"), res.sim.completion_s if ok else None))
        except Exception as err:
            errors[f"ceiling {net.name}"] = f"{type(err).__name__}: {err}"
            ceilings.append((None, None))
        _log(verbose, f"  ceiling under {net.name}: {time.perf_counter() - t:.1f} s")
    t = time.perf_counter()
    bound = lower_bound(demand, topo)
    _log(verbose, f"  bound: {time.perf_counter() - t:.1f} s")
    wall_s = time.perf_counter() - start
    plan_s = float(op.plan_s)
    rows = []
    for k, net in enumerate(nets):
        times = {name: v[k] for name, v in peers.items()}
        ran = {name: v for name, v in times.items() if v is not None}
        best = min(ran, key=ran.get) if ran else None
        comm = op_comm[k]
        total = plan_s + comm
        ceiling_plan, ceiling_s = ceilings[k]
        rows.append(
            {
                "point": point.label,
                "topology": point.topology,
                "nodes": point.nodes,
                "ranks": n,
                "workload": point.workload,
                "value": point.value,
                "total_bytes": int(demand.sum()),
                "model": net.name,
                "peers_s": times,
                "peer_errors": errors,
                "nccl_s": times.get("nccl"),
                "best_peer": best,
                "best_peer_s": ran.get(best),
                "op_plan": meta["plan"],
                "op_decision": meta["decision"],
                "op_plan_s": plan_s,
                "op_plan_s_min": meta.get("plan_s_min"),
                "op_comm_s": comm,
                "op_total_s": total,
                "op_valid": op.validation.ok,
                "nccl_over_op": times["nccl"] / total if times.get("nccl") else None,
                "best_peer_over_op": ran[best] / total if best else None,
                "plan_over_comm": plan_s / comm if comm > 0 else None,
                "ceiling_plan": ceiling_plan,
                "ceiling_s": ceiling_s,
                "op_over_ceiling": total / ceiling_s if ceiling_s else None,
                "op_comm_over_ceiling": comm / ceiling_s if ceiling_s else None,
                "bound_s": bound.best_s,
                "bound_kind": "lp" if bound.lp_relay_s is not None else "endpoint",
                "bound_over_op": bound.best_s / total if total > 0 else None,
                "wall_s": wall_s,
            }
        )
    return rows


def geomean(values: list[float]) -> float:
    return math.exp(sum(map(math.log, values)) / len(values)) if values else math.nan


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per model: the figures of issue 51's goals."""
    out = []
    for name in dict.fromkeys(r["model"] for r in rows):
        mine = [r for r in rows if r["model"] == name and r["op_valid"]]
        nccl = [r for r in mine if r["nccl_over_op"] is not None]
        best = [r for r in mine if r["best_peer_over_op"] is not None]
        ceiling = [r for r in mine if r["op_over_ceiling"] is not None]
        small = [
            r
            for r in mine
            if SMALL_RANKS[0] <= r["ranks"] <= SMALL_RANKS[1] and r["plan_over_comm"] is not None
        ]
        large = [r for r in mine if r["ranks"] >= LARGE_RANKS and r["plan_over_comm"] is not None]
        worst_small = max(small, key=lambda r: r["plan_over_comm"], default=None)
        worst_large = max(large, key=lambda r: r["plan_over_comm"], default=None)
        topo, nodes, workload, value = PLANNING_POINT
        at = [
            r
            for r in mine
            if (r["topology"], r["nodes"], r["workload"], r["value"])
            == (topo, nodes, workload, value)
        ]
        out.append(
            {
                "model": name,
                "points": len(mine),
                "nccl_over_op": geomean([r["nccl_over_op"] for r in nccl]),
                "best_peer_over_op": geomean([r["best_peer_over_op"] for r in best]),
                "op_over_ceiling": geomean([r["op_over_ceiling"] for r in ceiling]),
                "op_comm_over_ceiling": geomean([r["op_comm_over_ceiling"] for r in ceiling]),
                "bound_over_op": geomean([r["bound_over_op"] for r in mine if r["bound_over_op"]]),
                "lost_to_nccl": [
                    {"point": r["point"], "ratio": r["nccl_over_op"], "plan": r["op_plan"]}
                    for r in nccl
                    if r["nccl_over_op"] < 1 - TIE
                ],
                "lost_to_best_peer": [
                    {
                        "point": r["point"],
                        "peer": r["best_peer"],
                        "ratio": r["best_peer_over_op"],
                        "plan": r["op_plan"],
                    }
                    for r in best
                    if r["best_peer_over_op"] < 1 - TIE
                ],
                "max_plan_over_comm_8_64": worst_small["plan_over_comm"] if worst_small else None,
                "max_plan_over_comm_8_64_at": worst_small["point"] if worst_small else None,
                "plan_over_comm_256": worst_large["plan_over_comm"] if worst_large else None,
                "plan_s_r5080_bf3_x2_moe128": at[0]["op_plan_s"] if at else None,
            }
        )
    return out


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:.3f}"


def _x(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}×"


def print_tables(rows: list[dict[str, Any]], summary: list[dict[str, Any]]) -> None:
    for s in summary:
        name = s["model"]
        print(f"\n### under {name}\n")
        print(
            "| point | NCCL ms | best peer | best ms | op plan | plan µs | comm ms | op ms | "
            "NCCL ÷ op | best ÷ op | plan ÷ comm | ceiling | ceiling ms | op ÷ ceiling | "
            "LP bound ms |"
        )
        print("|---|---:|---|---:|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|")
        for r in rows:
            if r["model"] != name:
                continue
            print(
                f"| {r['point']} | {_ms(r['nccl_s'])} | {r['best_peer'] or '-'} | "
                f"{_ms(r['best_peer_s'])} | {r['op_plan']}"
                f"{'' if r['op_valid'] else ' (INVALID)'} | {r['op_plan_s'] * 1e6:.1f} | "
                f"{_ms(r['op_comm_s'])} | {_ms(r['op_total_s'])} | {_x(r['nccl_over_op'])} | "
                f"{_x(r['best_peer_over_op'])} | "
                f"{'-' if r['plan_over_comm'] is None else format(r['plan_over_comm'], '.1%')} | "
                f"{r['ceiling_plan'] or '-'} | {_ms(r['ceiling_s'])} | "
                f"{_x(r['op_over_ceiling'])} | {_ms(r['bound_s'])} |"
            )
    print()
    for line in summary_lines(summary):
        print(line)


def summary_lines(summary: list[dict[str, Any]]) -> list[str]:
    lines = []
    for s in summary:
        small = s["max_plan_over_comm_8_64"]
        large = s["plan_over_comm_256"]
        planning = s["plan_s_r5080_bf3_x2_moe128"]
        lines.append(
            f"{s['model']}: {s['points']} points; NCCL ÷ op {s['nccl_over_op']:.2f}× geomean, "
            f"best peer ÷ op {s['best_peer_over_op']:.2f}×, op ÷ ceiling "
            f"{s['op_over_ceiling']:.3f} (communication alone {s['op_comm_over_ceiling']:.3f}); "
            f"lost to NCCL on {len(s['lost_to_nccl'])}, to the best peer on "
            f"{len(s['lost_to_best_peer'])}; planning ÷ communication at most "
            + ("-" if small is None else f"{small:.1%} ({s['max_plan_over_comm_8_64_at']})")
            + " at 8-64 GPUs, "
            + ("-" if large is None else f"{large:.1%}")
            + " at 256 GPUs; planning at r5080-bf3 x2 MoE M=128: "
            + ("-" if planning is None else f"{planning * 1e6:.1f} µs")
        )
        best_is_nccl = {x["point"] for x in s["lost_to_best_peer"] if x["peer"] == "nccl"}
        for lost in s["lost_to_nccl"]:
            also = ", the best peer" if lost["point"] in best_is_nccl else ""
            lines.append(
                f"  {s['model']}: slower than NCCL{also} at {lost['point']} "
                f"({lost['ratio']:.3f}×, op runs {lost['plan']})"
            )
        for lost in s["lost_to_best_peer"]:
            if lost["point"] in best_is_nccl:
                continue
            lines.append(
                f"  {s['model']}: slower than {lost['peer']} at {lost['point']} "
                f"({lost['ratio']:.3f}×, op runs {lost['plan']})"
            )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="a subset: r5080-bf3 x 1 and 2")
    parser.add_argument(
        "--skip-large", action="store_true", help="leave out r5080-cx8 x 32 (256 GPUs)"
    )
    parser.add_argument(
        "--only",
        default=None,
        help="deployments to run, comma-separated, e.g. r5080-bf3x2,l20-cx7x1",
    )
    parser.add_argument(
        "--repeats", type=int, default=OP_REPEATS, help="calls timed per point (median)"
    )
    parser.add_argument(
        "--flush-mib",
        type=int,
        default=OP_FLUSH_BYTES >> 20,
        help="MiB of other memory traffic before each timed call (default 64)",
    )
    parser.add_argument(
        "--json",
        nargs="?",
        const="-",
        default=None,
        metavar="FILE",
        help="one JSON document, printed instead of the tables; with FILE, written there and "
        "the tables printed too",
    )
    args = parser.parse_args()
    chosen = points(args.quick, args.skip_large)
    if args.only:
        wanted = {w.strip().replace(" ", "") for w in args.only.split(",")}
        chosen = [p for p in chosen if f"{p.topology}x{p.nodes}" in wanted]
        if not chosen:
            parser.error(f"--only {args.only}: no point of the suite is on these deployments")
    rows: list[dict[str, Any]] = []
    start = time.perf_counter()
    load = [os.getloadavg()[0]]  # the planning is timed on this machine, shared or not
    for k, point in enumerate(chosen, 1):
        _log(True, f"[{k}/{len(chosen)}] {point.label} ({time.perf_counter() - start:.0f} s)")
        rows += measure(point, repeats=args.repeats, flush_bytes=args.flush_mib << 20, verbose=True)
    summary = summarize(rows)
    load.append(os.getloadavg()[0])
    if args.json:
        settings = {
            "models": list(NETWORK_MODELS),
            "peers": list(PEERS),
            "repeats": args.repeats,
            "flush_bytes": args.flush_mib << 20,
            "points": [p.label for p in chosen],
            "load_average": load,  # 1-minute, at the start and at the end
        }
        doc = json.dumps({"settings": settings, "rows": rows, "summary": summary}, indent=1)
        if args.json == "-":
            print(doc)
            return
        Path(args.json).write_text(doc + "\n")
    print_tables(rows, summary)
    print(
        f"1-minute load average {load[0]:.2f} at the start, {load[1]:.2f} at the end, on "
        f"{os.cpu_count()} CPUs (the planning is timed here: a loaded machine inflates it)"
    )


if __name__ == "__main__":
    main()
