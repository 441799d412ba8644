"""Calibration of the `pcie` network model: the fitted points and the hold-outs, side by side.

Fitted (research/contention-evidence.md), and nothing else:
- NVIDIA/nccl issue 1603, preset root4-gen4, NCCL alltoall 16 MiB per pair: 2 GB/s busbw with
  P2P through the CPU (`nccl_p2p_level=SYS`), 18 GB/s staged through host memory (P2P off). The
  root-complex βs follow in closed form (sim/network.py); this script checks them.
- The paper's Figure 10 NCCL point: 18.85 GB/s algbw on r5080-cx8 x 32, MoE top-8, M = 128.
  ``--fit`` bisects β of the NIC ingress class on it (every other parameter at its default).
Hold-outs, reported and never fitted: the paper's Figure 10 DeepEP point (28.11 GB/s) and the
peer-to-peer ratios its Figure 7 implies (per-deployment geomeans: NCCL 6.29x = sqrt(3.73 x
10.61), FAST 5.88x, DeepEP 1.72x slower than VarioPath, so DeepEP 3.66x and FAST 1.07x NCCL's
speed). VarioPath is never run here.

Run: ``python benchmarks/calibrate_network.py`` (``--fit`` to redo the bisection, ``--json``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import time

import numpy as np

from variopath_jax import workloads
from variopath_jax.schedulers import PlanRequest, get_scheduler
from variopath_jax.sim import NONE, PCIE, FluidSimulator, NetworkModel
from variopath_jax.topology import PathModel, preset

MIB = 2**20
FIG10_NCCL, FIG10_DEEPEP = 18.85, 28.11
FIG7_DEEPEP_OVER_NCCL = math.sqrt(3.73 * 10.61) / 1.72
FIG7_FAST_OVER_NCCL = math.sqrt(3.73 * 10.61) / 5.88
FIG7_POINTS = (("r5080-bf3", 4), ("r5080-bf3", 8), ("r5090-bf3", 2), ("r5090-bf3", 4))
FIG7_TOKENS = (16, 128)


def algbw(scheduler: str, topo, demand: np.ndarray, net: NetworkModel, **options) -> float:
    """Simulated algbw (GB/s) of one peer scheduler's schedule."""
    request = PlanRequest(demand, PathModel(topo), net.barrier_s, 0, options)
    schedule = get_scheduler(scheduler).plan(request)
    return FluidSimulator(topo, net).run(schedule).algbw_gbps


def root4(net: NetworkModel) -> dict[str, float]:
    """nccl issue 1603: alltoall of 16 MiB per pair on 4 GPUs, P2P through the CPU and staged."""
    demand = workloads.uniform(4, 16 * MIB)
    topo = preset("root4-gen4")
    staged = dataclasses.replace(topo, p2p=False)
    return {
        "p2p": algbw("nccl", topo, demand, net, nccl_p2p_level="SYS"),
        "staged": algbw("nccl", staged, demand, net),
    }


def fig10(net: NetworkModel, scheduler: str) -> float:
    return algbw(scheduler, preset("r5080-cx8", 32), workloads.moe(256, 128, seed=0), net)


def fig7_ratios(net: NetworkModel) -> dict[str, float]:
    """Geomean over the Figure 7 deployments (M = 16, 128) of each peer's speed over NCCL's."""
    logs: dict[str, list[float]] = {"deepep": [], "fast": []}
    for name, nodes in FIG7_POINTS:
        topo = preset(name, nodes)
        for tokens in FIG7_TOKENS:
            demand = workloads.moe(topo.num_ranks, tokens, seed=0)
            base = algbw("nccl", topo, demand, net)
            for peer in logs:
                logs[peer].append(math.log(algbw(peer, topo, demand, net) / base))
    return {peer: math.exp(sum(v) / len(v)) for peer, v in logs.items()}


def fit_nic_in(lo: float = 0.0, hi: float = 0.02, rounds: int = 14) -> float:
    """β of the NIC ingress class that puts Figure 10's NCCL point at 18.85 GB/s (bisection:
    algbw falls as β grows)."""
    for _ in range(rounds):
        mid = (lo + hi) / 2
        net = PCIE.replace(contention={**PCIE.contention, "nic_in": {"beta": mid, "floor": 0.0}})
        got = fig10(net, "nccl")
        print(f"  nic_in β = {mid:.6f}: NCCL {got:.2f} GB/s", flush=True)
        lo, hi = (mid, hi) if got > FIG10_NCCL else (lo, mid)
    return (lo + hi) / 2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--fit", action="store_true", help="redo the nic_in bisection")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    start = time.perf_counter()
    fitted = fit_nic_in() if args.fit else PCIE.contention["nic_in"]["beta"]
    nic_in = {"beta": fitted, "floor": 0.0}
    pcie = PCIE.replace(contention={**PCIE.contention, "nic_in": nic_in})
    rows = []
    for name, net in (("none", NONE), ("pcie", pcie)):
        r4 = root4(net)
        ratios = fig7_ratios(net)
        rows.append(
            {
                "contention": name,
                "root4_p2p_gbps": r4["p2p"],
                "root4_staged_gbps": r4["staged"],
                "fig10_nccl_gbps": fig10(net, "nccl"),
                "fig10_deepep_gbps": fig10(net, "deepep"),
                "fig7_deepep_over_nccl": ratios["deepep"],
                "fig7_fast_over_nccl": ratios["fast"],
            }
        )
    measured = {
        "contention": "measured",
        "root4_p2p_gbps": 2.0,
        "root4_staged_gbps": 18.0,
        "fig10_nccl_gbps": FIG10_NCCL,
        "fig10_deepep_gbps": FIG10_DEEPEP,
        "fig7_deepep_over_nccl": FIG7_DEEPEP_OVER_NCCL,
        "fig7_fast_over_nccl": FIG7_FAST_OVER_NCCL,
    }
    out = {"nic_in_beta": fitted, "rows": [measured, *rows], "wall_s": time.perf_counter() - start}
    if args.json:
        print(json.dumps(out, indent=2))
        return
    print(f"nic_in β = {fitted:.6f}  (sim/network.py has {PCIE.contention['nic_in']['beta']})")
    keys = [k for k in measured if k != "contention"]
    kinds = {
        "root4_p2p_gbps": "fit",
        "root4_staged_gbps": "fit",
        "fig10_nccl_gbps": "fit",
        "fig10_deepep_gbps": "hold-out",
        "fig7_deepep_over_nccl": "hold-out",
        "fig7_fast_over_nccl": "hold-out",
    }
    print(
        f"{'quantity':24s} {'role':9s} {'measured':>9s} {'none':>9s} {'pcie':>9s} {'pcie/meas':>9s}"
    )
    for k in keys:
        m, none, pc = measured[k], rows[0][k], rows[1][k]
        print(f"{k:24s} {kinds[k]:9s} {m:9.2f} {none:9.2f} {pc:9.2f} {pc / m:9.2f}")
    print(f"({out['wall_s']:.0f} s)")


if __name__ == "__main__":
    main()
