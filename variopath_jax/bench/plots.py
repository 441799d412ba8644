"""Plots of simulated runs (matplotlib, written to PNG)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from variopath_jax.bench.suites import Suite
from variopath_jax.bench.summary import model_of, ok, swept_value
from variopath_jax.sim import SimResult
from variopath_jax.topology import Topology


def plot_link_utilisation(
    result: SimResult, topo: Topology, path: str | Path, title: str = ""
) -> Path:
    """A heat map of every used link's utilisation (load / capacity) over time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from variopath_jax.viz import draw_link_utilisation, used_links

    used = used_links(topo, result)
    fig, ax = plt.subplots(figsize=(11, max(3.0, 0.12 * len(used) + 1.5)))
    mesh = draw_link_utilisation(ax, result, topo, used)
    if mesh is not None:
        fig.colorbar(mesh, ax=ax, label="utilisation (load / capacity)")
    ax.set_title(title or "link utilisation over time")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path


_STYLE = {  # colour and marker per system, stable across suites
    "variopath": ("#d62728", "o"),
    "variopath-robust": ("#7b0000", "h"),
    "nccl": ("#1f77b4", "s"),
    "msccl": ("#9467bd", "D"),
    "fast": ("#2ca02c", "^"),
    "deepep": ("#ff7f0e", "v"),
    "deepep-rdma": ("#8c564b", "<"),
    "railwave": ("#7f7f7f", ">"),
    "variopath-fixed-peer": ("#e377c2", "P"),
    "variopath-fixed-path": ("#17becf", "X"),
    "variopath-fixed-both": ("#bcbd22", "*"),
}


def plot_suite(suite: Suite, rows: list[dict], path: str | Path) -> Path:
    """The suite's figure in the paper's style, written to ``path`` (PNG).

    ``lines`` suites: algorithmic bandwidth (GB/s, mean over seeds) against the swept value or
    the payload per rank, one line per system, one panel per deployment and network model (a row
    of panels per model, side by side down the figure), the lower bound as a dashed ceiling;
    a system without a successful run in a panel is listed there as n/a.
    ``bars`` suites: completion time normalised to VarioPath (geomean over seeds) per system and
    model, beside the paper's values.
    """
    import matplotlib.pyplot as plt

    fig = figure(suite, rows)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def figure(suite: Suite, rows: list[dict]):
    """The suite's figure (``plot_suite``'s, not written), its title naming the GPU counts the
    rows show (``Suite.title_for``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return _bars(plt, suite, rows) if suite.plot == "bars" else _lines(plt, suite, rows)


_X_LABELS = {
    "payload": "payload per rank (KiB)",
    "moe": "tokens per rank M",
    "uniform": "message size per rank (MiB)",
    "zipf": "skewness factor s",
    "trace": "training step",
}


def _point_x(suite: Suite, rows: list[dict]) -> dict[float, float]:
    """The x of each swept value: itself, or its payload per rank in KiB averaged over seeds (the
    payload of an MoE demand depends on the seed), so that every system's line shares it."""
    if suite.x != "payload":
        return {swept_value(suite, r): swept_value(suite, r) for r in rows}
    payload: dict[float, list[float]] = {}
    for r in rows:
        payload.setdefault(swept_value(suite, r), []).append(r["payload_per_rank"] / 1024)
    return {v: float(np.mean(p)) for v, p in payload.items()}


def _mean_by(
    suite: Suite, rows: list[dict], point_x: dict[float, float], field: str
) -> tuple[np.ndarray, np.ndarray]:
    """x and the mean of ``field`` over the rows (seeds) at each x, sorted by x."""
    groups: dict[float, list[float]] = {}
    for r in rows:
        groups.setdefault(point_x[swept_value(suite, r)], []).append(r[field])
    xs = sorted(groups)
    return np.array(xs), np.array([np.mean(groups[x]) for x in xs])


def _lines(plt, suite: Suite, rows: list[dict]):
    from matplotlib.ticker import FuncFormatter

    deployments = list(dict.fromkeys((r["topology"], r["nodes"]) for r in rows))
    models = list(dict.fromkeys(model_of(r) for r in rows))
    cols = min(4, max(1, len(deployments)))
    per_model = -(-len(deployments) // cols) or 1  # rows of panels per model
    nrows = per_model * max(1, len(models))
    width = max(3.6 * cols, 7.5)
    fig, axes = plt.subplots(
        nrows, cols, figsize=(width, 3.0 * nrows + 0.8), squeeze=False, layout="constrained"
    )
    log_x = suite.workload != "zipf"
    panels = [
        (axes[m * per_model + d // cols, d % cols], dep, model)
        for m, model in enumerate(models)
        for d, dep in enumerate(deployments)
    ]
    used = {id(ax) for ax, _, _ in panels}
    for ax, (topo, nodes), model in panels:
        here = [r for r in rows if r["topology"] == topo and r["nodes"] == nodes]
        point_x = _point_x(suite, here)
        # one bound per demand: every system's row of a demand carries the same one
        demands = {(swept_value(suite, r), r["seed"]): r for r in here if r.get("bound_gbps")}
        xs, bound = _mean_by(suite, list(demands.values()), point_x, "bound_gbps")
        if len(xs):
            ax.plot(xs, bound, "k--", lw=1, label="lower bound")
        missing = []
        for system in suite.systems:
            mine = [
                r for r in here if r["scheduler"] == system.label and ok(r) and model_of(r) == model
            ]
            if not mine:
                missing.append(system.label)
                continue
            colour, marker = _STYLE.get(system.label, (None, "o"))
            xs, ys = _mean_by(suite, mine, point_x, "algbw_gbps")
            ax.plot(xs, ys, "-", marker=marker, color=colour, ms=4, lw=1.2, label=system.label)
        if log_x:
            ax.set_xscale("log", base=2)
            ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        if missing:
            ax.text(
                0.98,
                0.04,
                "n/a: " + ", ".join(missing),
                transform=ax.transAxes,
                ha="right",
                fontsize=7,
                color="0.3",
            )
        ax.set_ylim(bottom=0)
        ax.set_title(
            f"{topo}, {nodes} node{'s' if nodes > 1 else ''} ({here[0]['ranks']} GPUs), {model}",
            fontsize=9,
        )
        ax.set_xlabel(_X_LABELS["payload" if suite.x == "payload" else suite.workload], fontsize=8)
        ax.set_ylabel("algbw (GB/s)", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    for ax in axes.flat:
        if id(ax) not in used:
            ax.axis("off")
    handles = {}
    for ax in axes.flat:
        for h, label in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(label, h)
    fig.legend(
        handles.values(),
        handles.keys(),
        loc="outside lower center",
        ncol=min(len(handles), max(3, int(width // 1.6))),
        fontsize=8,
        frameon=False,
    )
    fig.suptitle(f"{suite.title_for(rows)} (simulated)", fontsize=10)
    return fig


def _bars(plt, suite: Suite, rows: list[dict]):
    reference = suite.systems[0].label
    claims = {c.system: c.ratio for c in suite.claims}
    models = list(dict.fromkeys(model_of(r) for r in rows))
    labels = [system.label for system in suite.systems]
    paper = [claims.get(label, 1.0 if label == reference else np.nan) for label in labels]
    x = np.arange(len(labels))
    width = 0.8 / (len(models) + 1)
    fig, ax = plt.subplots(figsize=(7.5, 3.6))
    colours = ("#d62728", "#1f77b4", "#2ca02c", "#9467bd")
    for k, model in enumerate(models):
        ref = {
            r["seed"]: r["completion_s"]
            for r in rows
            if r["scheduler"] == reference and ok(r) and model_of(r) == model
        }
        ours = []
        for label in labels:
            vals = [
                r["completion_s"] / ref[r["seed"]]
                for r in rows
                if r["scheduler"] == label and ok(r) and model_of(r) == model and r["seed"] in ref
            ]
            ours.append(float(np.exp(np.mean(np.log(vals)))) if vals else np.nan)
        offset = (k - len(models) / 2) * width
        ax.bar(x + offset, ours, width, label=f"simulated ({model})", color=colours[k % 4])
        for xi, v in zip(x, ours, strict=True):
            if not np.isnan(v):
                ax.text(xi + offset, v, f"{v:.2f}", ha="center", va="bottom", fontsize=7)
    offset = len(models) / 2 * width
    ax.bar(
        x + offset, paper, width, label="paper (Table 3)", color="white", edgecolor="k", hatch="//"
    )
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks(x, labels, fontsize=8)
    ax.set_ylabel(f"completion time / {reference}")
    ax.set_title(f"{suite.title_for(rows)} (simulated)", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
