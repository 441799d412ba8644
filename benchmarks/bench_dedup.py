"""Per-node deduplication of MoE dispatch (issue 30): what it saves and what it changes.

Prints, for random top-8 routing over 256 experts (``workloads.moe_nodes``, seeded):

1. ``crossings``: per sampled token, the ranks and the nodes on other nodes it goes to, and the
   inter-node bytes without / with deduplication, at 16, 64 and 256 GPUs (8 per node);
2. ``fig10``: the ``deepep`` peer without and with deduplication on 256 R5080-CX8 GPUs at
   M = 128 (algbw on the logical payload, under ``pcie`` and ``none``) beside the paper's
   measured 28.11 GB/s, a hold-out: nothing is fitted here;
3. ``fig7``: DeepEP's speed over NCCL's (geomean over calibrate_network.py's Figure 7 points),
   without and with deduplication, beside the 3.66x the paper implies (hold-out);
4. ``plan``: ``nccl``, ``deepep`` and ``variopath`` without and with deduplication (``variopath``
   through ``dedup.plan_two_phase``: relayed by the same-index GPU of the receiving node, phase 2
   after a barrier; ``dedup-direct-single``: a token with one destination on a node goes straight
   to it, only the others through the relay), algbw on the logical payload and planning time,
   on R5080-CX8 × 2 and × 8;
5. ``split``: where ``deepep``'s time goes on R5080-CX8 × 2 (M = 128): its whole schedule, its
   inter-node transfers alone and its intra-node transfers (direct and forwarding) alone, each
   simulated by itself, with the bytes each moves.

Run: ``python benchmarks/bench_dedup.py [--parts crossings,split,plan,fig7,fig10] [--tokens 128]``.
Slow parts: fig10 (a 256-GPU simulation per model), fig7 (16 simulations per model).
"""

from __future__ import annotations

import argparse
import math
import time

from variopath_jax import dedup, workloads
from variopath_jax.schedule import Schedule, Step
from variopath_jax.schedulers import PlanRequest, get_scheduler
from variopath_jax.sim import NONE, PCIE, FluidSimulator, NetworkModel
from variopath_jax.topology import PathModel, preset

FIG10_DEEPEP = 28.11  # GB/s, the paper's Figure 10 at M = 128 (hold-out)
FIG7_DEEPEP_OVER_NCCL = math.sqrt(3.73 * 10.61) / 1.72  # the paper's implied ratio (hold-out)
FIG7_POINTS = (("r5080-bf3", 4), ("r5080-bf3", 8), ("r5090-bf3", 2), ("r5090-bf3", 4))
FIG7_TOKENS = (16, 128)


def run(
    scheduler: str,
    topo,
    nodes: workloads.NodeDemand,
    net: NetworkModel,
    dedup_on: bool,
    direct_single: bool = False,
) -> tuple[float, float]:
    """(algbw on the logical payload in GB/s, planning seconds) of one scheduler."""
    options = {"node_demand": nodes} if dedup_on and scheduler == "deepep" else {}
    req = PlanRequest(nodes.pairs, PathModel(topo), net.barrier_s, 0, options, network=net)
    start = time.perf_counter()
    if dedup_on and scheduler != "deepep":
        schedule = dedup.plan_two_phase(scheduler, req, nodes, direct_single)
    else:
        schedule = get_scheduler(scheduler).plan(req)
    planning = time.perf_counter() - start
    result = FluidSimulator(topo, net).run(schedule)
    return dedup.algbw_gbps(result, nodes), planning


def crossings(tokens: int) -> None:
    print(f"crossings (top-8 of 256 experts, 8 GPUs per node, {tokens} tokens per rank, seed 0)")
    print(f"{'GPUs':>5}{'ranks/token':>13}{'nodes/token':>13}{'inter-node bytes ratio':>24}")
    for n in (16, 64, 256):
        nodes = workloads.moe_nodes(n, tokens, 8, seed=0)
        ranks, per_node = nodes.crossings_per_token()
        ratio = nodes.inter_node_bytes(False) / nodes.inter_node_bytes(True)
        print(f"{n:>5}{ranks:>13.2f}{per_node:>13.2f}{ratio:>23.2f}x")


def fig10() -> None:
    topo = preset("r5080-cx8", 32)
    nodes = workloads.moe_nodes(256, 128, topo.gpus_per_node, seed=0)
    print("fig10 (256 R5080-CX8 GPUs, M = 128): deepep algbw, GB/s")
    for net in (PCIE, NONE):
        plain, _ = run("deepep", topo, nodes, net, False)
        deduped, _ = run("deepep", topo, nodes, net, True)
        print(
            f"  {net.name:5s} without dedup {plain:6.2f}  with dedup {deduped:6.2f}  "
            f"measured {FIG10_DEEPEP} (hold-out; with dedup / measured {deduped / FIG10_DEEPEP:.2f})"
        )


def fig7() -> None:
    print("fig7 (geomean over R5080-BF3 x 4, x 8, R5090-BF3 x 2, x 4; M = 16, 128): deepep / nccl")
    for net in (PCIE, NONE):
        logs = {False: [], True: []}
        for name, count in FIG7_POINTS:
            topo = preset(name, count)
            for tokens in FIG7_TOKENS:
                nodes = workloads.moe_nodes(topo.num_ranks, tokens, topo.gpus_per_node, seed=0)
                base, _ = run("nccl", topo, nodes, net, False)
                for on in logs:
                    logs[on].append(math.log(run("deepep", topo, nodes, net, on)[0] / base))
        plain, deduped = (math.exp(sum(v) / len(v)) for v in logs.values())
        print(
            f"  {net.name:5s} without dedup {plain:5.2f}x  with dedup {deduped:5.2f}x  "
            f"paper {FIG7_DEEPEP_OVER_NCCL:.2f}x (hold-out)"
        )


def plan(tokens: int) -> None:
    print(f"plan (R5080-CX8, M = {tokens}): algbw on the logical payload GB/s [planning s]")
    for count in (2, 8):
        topo = preset("r5080-cx8", count)
        nodes = workloads.moe_nodes(topo.num_ranks, tokens, topo.gpus_per_node, seed=0)
        for net in (PCIE, NONE):
            cells = []
            for scheduler in ("nccl", "deepep", "variopath"):
                for on in (False, True):
                    if scheduler == "nccl" and on:
                        continue
                    bw, secs = run(scheduler, topo, nodes, net, on)
                    label = scheduler + ("+dedup" if on else "")
                    cells.append(f"{label} {bw:.2f} [{secs:.2f}]")
            bw, secs = run("variopath", topo, nodes, net, True, direct_single=True)
            cells.append(f"variopath+dedup-direct-single {bw:.2f} [{secs:.2f}]")
            print(f"  {topo.num_ranks:>3} GPUs {net.name:5s} " + "  ".join(cells), flush=True)


def _part(schedule: Schedule, topo, net: NetworkModel, crossing: bool | None) -> str:
    """Simulated ms [MiB] of ``schedule``'s transfers between nodes (``crossing`` True), inside
    nodes (False) or all (None), alone."""
    m = topo.gpus_per_node

    def keep(t) -> bool:
        return crossing is None or (t.src // m != t.dst // m) == crossing

    steps = [Step(tuple(filter(keep, st.transfers)), st.deps, st.overhead) for st in schedule.steps]
    part = Schedule(schedule.ranks, steps, schedule.fingerprint, schedule.lambda_s)
    moved = sum(t.nbytes for st in steps for t in st.transfers) / 2**20
    ms = FluidSimulator(topo, net).run(part).completion_s * 1e3
    return f"{ms:.3f} [{moved:.0f}]"


def split(tokens: int) -> None:
    topo = preset("r5080-cx8", 2)
    nodes = workloads.moe_nodes(topo.num_ranks, tokens, topo.gpus_per_node, seed=0)
    print(f"split (deepep on R5080-CX8 x 2, M = {tokens}): simulated ms [MiB moved]")
    for net in (PCIE, NONE):
        for on in (False, True):
            options = {"node_demand": nodes} if on else {}
            req = PlanRequest(nodes.pairs, PathModel(topo), net.barrier_s, 0, options)
            schedule = get_scheduler("deepep").plan(req)
            print(
                f"  {net.name:5s} {'with' if on else 'without':7s} dedup: whole "
                f"{_part(schedule, topo, net, None)}  inter-node alone "
                f"{_part(schedule, topo, net, True)}  intra-node alone "
                f"{_part(schedule, topo, net, False)}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--parts", default="crossings,split,plan,fig7,fig10")
    parser.add_argument("--tokens", type=int, default=128)
    args = parser.parse_args()
    parts = args.parts.split(",")
    if "crossings" in parts:
        crossings(args.tokens)
    if "split" in parts:
        split(args.tokens)
    if "plan" in parts:
        plan(args.tokens)
    if "fig7" in parts:
        fig7()
    if "fig10" in parts:
        fig10()


if __name__ == "__main__":
    main()
