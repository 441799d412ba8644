"""VarioPath against every registered peer on demands no suite was built from.

The evaluation suites (``variopath bench``) are the paper's points; a planner tuned on them
could fit them alone. This check draws points the suites never use, from a seeded generator
(seed 2026 by default; the suites use seeds 0–4): a preset and node count, and a demand of one of
five kinds: MoE routing with a random expert count, top-k and token count; Zipf skew of random
strength and size; sequence parallelism (DeepSpeed-Ulysses head/context split); an incast, where
a few hot ranks receive most bytes; sparse random traffic, where every rank talks to a quarter of
the others. Each point is planned by every system and simulated under ``pcie``, ``pcie-fair``
and ``none``; ``variopath`` is planned for each model, ``variopath-robust`` once for all three
(the robust choice, judged under each).

Printed: per point, VarioPath's time and each peer's speedup (peer time / VarioPath's; below 1:
VarioPath is slower), then per peer and model the geomean, the worst point and on how many
points VarioPath is strictly faster; per model, the robust choice against the best peer at each
point and its regret (its time / variopath's). Run: ``python benchmarks/bench_unseen.py
[--points 24] [--seed 2026] [--json]``.
"""

from __future__ import annotations

import argparse
import json
import math
import time

import numpy as np

from variopath_jax import workloads
from variopath_jax.runner import run_one
from variopath_jax.schedule import Schedule
from variopath_jax.sim import UNPROFILED_MODELS, FluidSimulator
from variopath_jax.topology import PathModel, preset

PEERS = ("nccl", "msccl", "pairwise", "fast", "deepep", "deepep-rdma", "railwave")
MODELS = UNPROFILED_MODELS  # pcie, pcie-fair, none
ROBUST = "variopath-robust"
DEPLOYMENTS = (
    ("r5080-bf3", 1),
    ("r5080-bf3", 2),
    ("r5080-bf3", 4),
    ("r5080-cx8", 2),
    ("r5090-bf3", 1),
    ("r5090-bf3", 2),
    ("l20-cx7", 1),
    ("l20-cx7", 2),
    ("root4-gen4", 1),
)
KINDS = ("moe", "zipf", "sp", "incast", "sparse")


def draw_demand(kind: str, ranks: int, rng: np.random.Generator) -> tuple[np.ndarray, str]:
    """A demand of ``kind`` with random parameters, and a label naming them."""
    seed = int(rng.integers(1000, 1 << 30))
    if kind == "moe":
        experts = int(rng.choice([64, 128, 256]))
        experts -= experts % ranks
        top_k = int(rng.choice([2, 4, 8]))
        tokens = int(2 ** rng.uniform(0, 9))
        d = workloads.moe(ranks, tokens, experts=max(experts, ranks), top_k=top_k, seed=seed)
        return d, f"moe E={max(experts, ranks)} k={top_k} M={tokens}"
    if kind == "zipf":
        skew, mib = float(rng.uniform(0.2, 1.0)), int(2 ** rng.integers(0, 7))
        return workloads.zipf(ranks, skew, mib << 20, seed=seed), f"zipf s={skew:.2f} {mib} MiB"
    if kind == "sp":  # Ulysses: the all-to-all runs within groups of H head-parallel ranks
        heads = int(rng.choice([h for h in (2, 4, 8, 20, 40) if ranks % h == 0]))
        d = workloads.sp(heads, ranks // heads, seq_len=int(rng.choice([32768, 75600, 151200])))
        return d, f"sp H={heads} C={ranks // heads}"
    total = int(2 ** rng.uniform(20, 26)) * ranks  # 1..64 MiB per rank on average
    if kind == "incast":
        hot = rng.choice(ranks, size=max(1, ranks // 8), replace=False)
        weight = np.ones((ranks, ranks))
        weight[:, hot] *= 8.0
    else:  # sparse
        weight = (rng.random((ranks, ranks)) < 0.25) * rng.random((ranks, ranks))
    np.fill_diagonal(weight, 0.0)
    d = np.floor(weight / weight.sum() * total).astype(np.int64)
    return d, f"{kind} {total / ranks / (1 << 20):.1f} MiB/rank"


def measure(points: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    out = []
    for p in range(points):
        name, nodes = DEPLOYMENTS[int(rng.integers(len(DEPLOYMENTS)))]
        kind = KINDS[p % len(KINDS)]
        topo = preset(name, nodes)
        model = PathModel(topo)
        demand = np.zeros((1, 1))
        while not demand.any():  # a draw with no off-diagonal bytes is drawn again
            demand, label = draw_demand(kind, topo.num_ranks, rng)
            np.fill_diagonal(demand, 0)
        row = {"point": p, "topology": name, "nodes": nodes, "demand": label, "times": {}}
        try:  # planned once, for all three models
            robust: Schedule | str = run_one(model, ROBUST, demand, seed=seed).schedule
        except Exception as err:
            robust = f"error: {err}"
        for network in MODELS:
            times = row["times"][network] = {}
            for system in ("variopath", *PEERS):
                try:
                    res = run_one(model, system, demand, network=network, seed=seed)
                except Exception as err:  # a peer that cannot plan this demand: recorded
                    times[system] = f"error: {err}"
                    continue
                if not res.validation.ok:
                    times[system] = f"invalid: {res.validation.errors[0]}"
                    continue
                times[system] = res.sim.completion_s
            times[ROBUST] = (
                robust
                if isinstance(robust, str)
                else FluidSimulator(topo, network).run(robust).completion_s
            )
        out.append(row)
    return out


def summarize(rows: list[dict]) -> dict:
    """Per model and peer: geomean speedup, worst point, points VarioPath is strictly faster."""
    out = {}
    for network in MODELS:
        for peer in PEERS:
            ratios = [
                r["times"][network][peer] / r["times"][network]["variopath"]
                for r in rows
                if isinstance(r["times"][network].get(peer), float)
                and isinstance(r["times"][network].get("variopath"), float)
            ]
            if ratios:
                out[f"{peer}/{network}"] = {
                    "points": len(ratios),
                    "geomean": math.exp(sum(map(math.log, ratios)) / len(ratios)),
                    "worst": min(ratios),
                    "faster": sum(x > 1 + 1e-9 for x in ratios),
                    "ties": sum(abs(x - 1) <= 1e-9 for x in ratios),
                }
        versus, regret = [], []
        for r in rows:
            t = r["times"][network]
            best = [t[p] for p in PEERS if isinstance(t.get(p), float)]
            if best and isinstance(t.get("variopath"), float) and isinstance(t[ROBUST], float):
                versus.append(min(best) / t[ROBUST])
                regret.append(t[ROBUST] / t["variopath"])
        if versus:
            out[f"{ROBUST}/{network}"] = {
                "points": len(versus),
                "vs_best_peer_geomean": math.exp(sum(map(math.log, versus)) / len(versus)),
                "vs_best_peer_worst": min(versus),
                "not_slower_than_best_peer": sum(x >= 1 - 1e-9 for x in versus),
                "regret_max": max(regret),
            }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--points", type=int, default=24)
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    start = time.perf_counter()
    rows = measure(args.points, args.seed)
    summary = summarize(rows)
    if args.json:
        print(json.dumps({"points": rows, "summary": summary}))
        return
    for r in rows:
        parts = []
        for network in MODELS:
            t = r["times"][network]
            vp = t["variopath"]
            if not isinstance(vp, float):
                parts.append(f"{network}: variopath {vp}")
                continue
            peers = " ".join(
                f"{p} {t[p] / vp:.2f}" if isinstance(t[p], float) else f"{p} -" for p in PEERS
            )
            rb = t[ROBUST]
            robust = f"{rb / vp:.2f}" if isinstance(rb, float) else "-"
            parts.append(f"{network}: {vp * 1e6:.0f} us | {peers} | robust/variopath {robust}")
        print(f"{r['topology']} x{r['nodes']} {r['demand']}\n    " + "\n    ".join(parts))
    print(
        f"\nspeedup = peer time / VarioPath time, {len(rows)} points, {time.perf_counter() - start:.0f} s"
    )
    for key, s in summary.items():
        if key.startswith(ROBUST):
            print(
                f"{key:>28}: best peer / robust geomean {s['vs_best_peer_geomean']:.2f}x, worst "
                f"{s['vs_best_peer_worst']:.2f}x, not slower than the best peer on "
                f"{s['not_slower_than_best_peer']}/{s['points']}; regret <= {s['regret_max']:.2f}"
            )
            continue
        print(
            f"{key:>28}: geomean {s['geomean']:.2f}x, worst {s['worst']:.2f}x, "
            f"VarioPath faster on {s['faster']}/{s['points']} (ties {s['ties']})"
        )


if __name__ == "__main__":
    main()
