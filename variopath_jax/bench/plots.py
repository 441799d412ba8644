"""Plots of simulated runs (matplotlib, written to PNG)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from variopath_jax.sim import SimResult
from variopath_jax.topology import Topology


def plot_link_utilisation(
    result: SimResult, topo: Topology, path: str | Path, title: str = ""
) -> Path:
    """A heat map of every used link's utilisation (load / capacity) over time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if result.link_load is None:
        raise ValueError("simulate with record_links=True to plot link utilisation")
    intervals, loads = result.link_load
    g = topo.graph
    cap = np.array([lk.gbs for lk in g.links])
    used = np.flatnonzero(loads.max(axis=0) > 0) if len(loads) else np.array([], dtype=int)
    kinds = ["pcie", "fabric", "socket", "nvlink", "nic", "uplink"]
    used = sorted(used, key=lambda lid: (kinds.index(g.links[lid].kind), lid))
    fig, ax = plt.subplots(figsize=(11, max(3.0, 0.12 * len(used) + 1.5)))
    if used:
        # fill the gaps between intervals with traffic by idle (zero-load) intervals
        edges, rows = [float(intervals[0, 0])], []
        for (t0, t1), load in zip(intervals, loads, strict=True):
            if t0 > edges[-1]:
                rows.append(np.zeros(len(used)))
                edges.append(float(t0))
            rows.append(load[used] / cap[used])
            edges.append(float(t1))
        util = np.array(rows).T
        edges = np.array(edges) * 1e3
        mesh = ax.pcolormesh(
            edges, np.arange(len(used) + 1), util, cmap="viridis", vmin=0, vmax=1, shading="flat"
        )
        fig.colorbar(mesh, ax=ax, label="utilisation (load / capacity)")
        ax.set_yticks(np.arange(len(used)) + 0.5)
        ax.set_yticklabels([g.link_name(lid) for lid in used], fontsize=5)
    ax.set_xlabel("time (ms)")
    ax.set_title(title or "link utilisation over time")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path
