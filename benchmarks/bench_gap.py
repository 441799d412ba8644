"""The paper's Figure 12 from ``variopath gap --json`` outputs: a CSV of every row, a PNG (per
output, :func:`variopath_jax.viz.plot_gap`) and a markdown table per size, with the paper's
figures beside ours; where the rows carry the hybrid model (``--oracles`` with ``hybrid``), a
second markdown table of it: certified optima, variopath's simulated bandwidth over the hybrid
optimum's (mean, worst) and the proven model gap.

The study itself is the CLI (it takes minutes per instance set; run it under ``nice``)::

    variopath gap --topology r5080-bf3 --nodes 1 --sizes 8,16,32,64,128 --seeds 5 \\
        --time-limit 30 --json > gap8.json
    python benchmarks/bench_gap.py gap8.json [gap16.json ...] --out docs/img/gap
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from variopath_jax import viz
from variopath_jax.solver.gap import GapRow
from variopath_jax.topology import preset


def _gpus(out: dict) -> int:
    """The study's rank count, from its topology preset and node count."""
    return preset(out["topology"], out["nodes"]).num_ranks


def _pct(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}%}"


def hybrid_table(out: dict) -> list[str]:
    """Markdown rows of the hybrid model, per size and overall."""
    gpus = _gpus(out)
    lines = []
    for size, st in [*out["by_size"].items(), ("all", out["overall"])]:
        if not st.get("hybrid_instances"):
            continue
        bold = "**" if size == "all" else ""
        cells = [
            f"{gpus}",
            out["contention"],
            size,
            f"{st['hybrid_certified']}/{st['hybrid_instances']}",
            _pct(st["mean_variopath_of_hybrid"]),
            _pct(st["worst_variopath_of_hybrid"]),
            _pct(st["mean_hybrid_gap"], 2),
            _pct(st["worst_hybrid_gap"], 2),
        ]
        lines.append("| " + " | ".join(f"{bold}{c}{bold}" for c in cells) + " |")
    return lines


def table(out: dict) -> list[str]:
    """Markdown rows: per size and overall, for one study output."""
    gpus = _gpus(out)
    lines = []
    for size, st in [*out["by_size"].items(), ("all", out["overall"])]:
        if st.get("mean_ratio") is None:  # the epoch and channel models were not run
            continue
        bold = "**" if size == "all" else ""
        cells = [
            f"{gpus}",
            size,
            str(st["instances"]),
            f"{st['certified']}/{st['instances']}",
            _pct(st["mean_ratio"]),
            _pct(st["worst_ratio"]),
            _pct(st["mean_ratio_tuned"], 0),
            _pct(st["mean_variopath_of_channel"]),
            _pct(st["worst_variopath_of_channel"]),
            _pct(st["mean_channel_gap"]),
            _pct(st["worst_channel_gap"]),
            _pct(st["mean_variopath_of_bound"]),
        ]
        lines.append("| " + " | ".join(f"{bold}{c}{bold}" for c in cells) + " |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("inputs", nargs="+", type=Path, help="variopath gap --json outputs")
    parser.add_argument("--out", type=Path, default=Path("gap"), help="output path prefix")
    args = parser.parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    outputs = [json.loads(p.read_text()) for p in args.inputs]
    fig, axes = plt.subplots(1, len(outputs), figsize=(7.5 * len(outputs), 4.2), squeeze=False)
    with open(f"{args.out}.csv", "w", newline="") as f:
        writer = None
        for k, out in enumerate(outputs):
            rows = [GapRow(**r) for r in out["rows"]]
            for r in out["rows"]:
                if writer is None:
                    writer = csv.DictWriter(f, ["gpus", *r])
                    writer.writeheader()
                writer.writerow({"gpus": _gpus(out), **r})
            title = (
                f"{out['topology']} x {out['nodes']} ({_gpus(out)} GPUs), "
                f"{out['contention']} model, λ = {out['lambda_us']:g} µs, "
                f"{out['time_limit_s']:g} s per solve"
            )
            if all(r.epoch_status != "NOT_RUN" for r in rows):  # the figure needs the epoch model
                viz.plot_gap(rows, ax=axes[0][k], title=title)
            else:
                axes[0][k].set_axis_off()
    fig.tight_layout()
    fig.savefig(f"{args.out}.png", dpi=130)
    header = (
        "| GPUs | MiB/rank | instances | epoch certified | VP/epoch mean | worst | "
        "tuned/epoch | VP/channel mean | worst | channel gap mean | worst | VP/LP |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|"
    )
    body = [line for out in outputs for line in table(out)]
    if body:  # outputs with the epoch model
        Path(f"{args.out}.md").write_text(header + "\n" + "\n".join(body) + "\n")
        print(header)
        print("\n".join(body))
        print("paper (Figure 12): mean 99.18%, worst 91.92%, every instance certified")
    hybrid = [line for out in outputs for line in hybrid_table(out)]
    if hybrid:
        text = (
            "| GPUs | model | MiB/rank | hybrid certified | tuned/hybrid mean | worst | "
            "hybrid gap mean | worst |\n|---|---|---|---|---|---|---|---|\n" + "\n".join(hybrid)
        )
        Path(f"{args.out}-hybrid.md").write_text(text + "\n")
        print(text)


if __name__ == "__main__":
    main()
