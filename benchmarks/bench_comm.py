"""Communication only, from a ``variopath bench`` run: per figure and network model, how often
``variopath`` (planned for the model) is slower than the best peer, its geomean over NCCL and
over the best peer, the robust choice (``variopath-robust``, planned once over the unprofiled
models) against the best peer and its regret over ``variopath``, and ``variopath`` over the LP
bound. Issue 50's goal reads off it: ``variopath`` never slower than the best peer on Figures
7-10 under ``pcie`` and ``pcie-fair``, the robust regret at most 1.05. Planning is not counted
here (``variopath bench``'s own summary charges it; docs/evaluation.md).

Run: ``variopath bench all --out DIR`` then ``python benchmarks/bench_comm.py DIR [--json]``.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
from collections import defaultdict
from pathlib import Path

SUITES = ("fig7", "fig8", "fig9", "fig10")
POINT = ("topology", "nodes", "workload", "tokens", "mib_per_rank", "skew", "step", "seed")
TIE = 1e-9  # a ratio within this of 1 is a tie, not a loss


def geomean(values: list[float]) -> float:
    return math.exp(sum(map(math.log, values)) / len(values)) if values else math.nan


def judge(out: Path) -> list[dict]:
    """One row per (suite, model) of the suites ``out`` holds."""
    rows = []
    for suite in SUITES:
        path = out / suite / f"{suite}.csv"
        if not path.is_file():
            continue
        times: dict[tuple, dict[str, float]] = defaultdict(dict)
        bound: dict[tuple, float] = {}
        for r in csv.DictReader(path.open()):
            if r["error"] or r["valid"] != "True":
                continue
            key = (r["contention"], *(r[k] for k in POINT))
            times[key][r["scheduler"]] = float(r["completion_s"])
            bound[key] = float(r["bound_s"])
        for model in dict.fromkeys(k[0] for k in times):
            over_best, over_nccl, robust_best, regret, over_bound, lost = [], [], [], [], [], []
            for key, t in times.items():
                if key[0] != model or "variopath" not in t:
                    continue
                peers = {k: v for k, v in t.items() if not k.startswith("variopath")}
                if not peers:
                    continue
                best = min(peers, key=peers.get)
                over_best.append(peers[best] / t["variopath"])
                if over_best[-1] < 1 - TIE:
                    lost.append(
                        {
                            "point": dict(zip(POINT, key[1:], strict=True)),
                            "peer": best,
                            "ratio": over_best[-1],
                        }
                    )
                if "nccl" in t:
                    over_nccl.append(t["nccl"] / t["variopath"])
                if "variopath-robust" in t:
                    robust_best.append(peers[best] / t["variopath-robust"])
                    regret.append(t["variopath-robust"] / t["variopath"])
                over_bound.append(bound[key] / t["variopath"])
            rows.append(
                {
                    "suite": suite,
                    "model": model,
                    "points": len(over_best),
                    "slower_than_best_peer": len(lost),
                    "worst_over_best_peer": min(over_best, default=math.nan),
                    "over_best_peer": geomean(over_best),
                    "over_nccl": geomean(over_nccl),
                    "robust_slower_than_best_peer": sum(r < 1 - TIE for r in robust_best),
                    "robust_regret_max": max(regret, default=math.nan),
                    "robust_regret_over_1_05": sum(r > 1.05 for r in regret),
                    "bound_fraction": geomean(over_bound),
                    "lost": lost,
                }
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("out", type=Path, help="the --out directory of a `variopath bench` run")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = judge(args.out)
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print(
        "| figure | model | points | variopath slower than the best peer (worst) | best peer ÷ "
        "variopath | NCCL ÷ variopath | robust slower than the best peer | robust regret max "
        "(> 1.05) | variopath ÷ LP bound |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['suite']} | {r['model']} | {r['points']} | {r['slower_than_best_peer']} "
            f"({r['worst_over_best_peer']:.2f}×) | {r['over_best_peer']:.2f}× | "
            f"{r['over_nccl']:.2f}× | {r['robust_slower_than_best_peer']} | "
            f"{r['robust_regret_max']:.3f} ({r['robust_regret_over_1_05']}) | "
            f"{r['bound_fraction']:.0%} |"
        )
    for r in rows:
        for lost in r["lost"]:
            point = ", ".join(f"{k}={v}" for k, v in lost["point"].items() if v)
            print(
                f"{r['suite']} {r['model']}: slower than {lost['peer']} ({lost['ratio']:.3f}×) at {point}"
            )


if __name__ == "__main__":
    main()
