"""Pictures of topologies, catalogs, plans and simulations (matplotlib), for the notebooks.

Every function draws with ``matplotlib.pyplot`` on the current backend (inline in a notebook; the
tests select Agg) and returns its ``Axes`` or ``Figure``; none saves a file or changes the
backend. Times are drawn in ms, bytes in MiB, rates in GB/s (1e9 B/s) per direction.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from variopath_jax.explore import PlanIteration, shared_links
from variopath_jax.schedule import Schedule
from variopath_jax.sim import SimResult
from variopath_jax.topology import PathModel, Topology

MIB = float(2**20)
_LINK_KINDS = ("pcie", "fabric", "socket", "nvlink", "nic", "uplink")
_PATH_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf")
_BOX = {
    "cpu": ("#404040", "white"),
    "hostbridge": ("#8c8c8c", "white"),
    "switch": ("#d9d9d9", "black"),
    "nic": ("#fdd49e", "black"),
    "net": ("#fdd49e", "black"),
    "tor": ("#fdd49e", "black"),
}


def _time_scale(seconds: float) -> tuple[float, str]:
    """Factor and unit to draw times up to ``seconds``: µs below 2 ms, else ms."""
    return (1e6, "µs") if seconds < 2e-3 else (1e3, "ms")


def _plt():
    import matplotlib.pyplot as plt

    return plt


def _axes(ax: Axes | None, size: tuple[float, float]) -> Axes:
    if ax is not None:
        return ax
    _, ax = _plt().subplots(figsize=size)
    return ax


# ----- the PCIe tree ------------------------------------------------------------------------
def tree_layout(topo: Topology) -> dict[int, tuple[float, float]]:
    """(x, y) of every vertex of ``topo.graph``: each node a tree with its sockets on top (y = 0)
    and one level per PCIe hop below, leaves one unit apart, nodes side by side, the network
    (and any top-of-rack switches) below them all."""
    g = topo.graph
    children: dict[int, list[int]] = {v: [] for v in range(len(g.vertices))}
    for v, p in enumerate(g.parent):
        if p >= 0:
            children[p].append(v)
    pos: dict[int, tuple[float, float]] = {}
    slot = 0.0

    def place(v: int, depth: int) -> float:
        nonlocal slot
        if not children[v]:
            x = slot
            slot += 1.0
        else:
            xs = [place(c, depth + 1) for c in children[v]]
            x = (xs[0] + xs[-1]) / 2
        pos[v] = (x, -float(depth))
        return x

    centres = []
    for k in range(topo.nodes):
        first = slot
        for v, kind in enumerate(g.kinds):
            if kind == "cpu" and g.node_of[v] == k:
                place(v, 0)
        centres.append((first + slot - 1) / 2)
        slot += 1.0
    bottom = min(y for _, y in pos.values())
    for v, kind in enumerate(g.kinds):
        if kind == "tor":
            pos[v] = (centres[g.node_of[v]], bottom - 0.8)
    if g.net >= 0:
        pos[g.net] = ((centres[0] + centres[-1]) / 2, bottom - (1.6 if g.hub else 1.0))
    return pos


def _label(topo: Topology, v: int) -> str:
    g = topo.graph
    kind = g.kinds[v]
    name = g.vertices[v].split("/")[-1]
    if kind == "gpu":
        return f"GPU {g.gpus.index(v)}"
    if kind == "cpu":
        return name.upper()
    return name


def _rate(gbs: float) -> str:
    return f"{gbs:g}"


def _bezier(p0: np.ndarray, c: np.ndarray, p1: np.ndarray, k: int = 25) -> np.ndarray:
    """Points of the quadratic Bézier curve from p0 to p1 with control point c."""
    t = np.linspace(0.0, 1.0, k)[:, None]
    return (1 - t) ** 2 * p0 + 2 * t * (1 - t) * c + t**2 * p1


class _Curves:
    """Where a topology drawing routes each directed link: straight along the tree, and arched
    above the tree for a socket or fabric link that would cross other devices."""

    def __init__(self, topo: Topology, pos: dict[int, tuple[float, float]]) -> None:
        self.graph = topo.graph
        self.pos = {v: np.array(p) for v, p in pos.items()}

    def ends(self, lid: int) -> tuple[np.ndarray, np.ndarray]:
        lk = self.graph.links[lid]
        return self.pos[lk.src], self.pos[lk.dst]

    def arched(self, lid: int) -> bool:
        (x0, y0), (x1, y1) = self.ends(lid)
        lo, hi = sorted((x0, x1))
        return y0 == y1 and any(y == y0 and lo < x < hi for x, y in self.pos.values())

    def control(self, lid: int, offset: float = 0.0) -> np.ndarray:
        """The control point of link ``lid``'s curve, moved ``offset`` to its left (seen along
        the link's direction), so that opposite directions and several paths stay apart."""
        p0, p1 = self.ends(lid)
        d = p1 - p0
        mid = (p0 + p1) / 2
        if self.arched(lid):
            return mid + np.array([0.0, 0.25 + 0.06 * abs(d[0]) + np.sign(d[0]) * offset])
        return mid + offset * np.array([-d[1], d[0]]) / np.hypot(*d)

    def points(self, lid: int, offset: float = 0.0, clip: bool = False) -> np.ndarray:
        p0, p1 = self.ends(lid)
        pts = _bezier(p0, self.control(lid, offset), p1)
        if clip:  # keep the arrow outside the two device boxes
            box = np.array([0.42, 0.16])
            outside = np.flatnonzero(
                (np.abs(pts - p0) > box).any(axis=1) & (np.abs(pts - p1) > box).any(axis=1)
            )
            pts = pts[outside[0] - 1 : outside[-1] + 2] if len(outside) else pts
        return pts


def draw_topology(
    topo: Topology,
    ax: Axes | None = None,
    *,
    model: PathModel | None = None,
    paths: Sequence[Sequence[int]] = (),
    labels: Sequence[str] = (),
    rates: bool = True,
    title: str | None = None,
) -> Axes:
    """The PCIe tree of every node: sockets, host bridges, switches, GPUs (coloured by rank
    group, labelled by rank) and NICs, the inter-socket, switch-fabric and NVLink links, the NICs'
    links to the network, each link's rate in GB/s per direction ("up/down" where they differ).

    ``paths`` (directed link ids, e.g. ``Path.links`` or ``Transfer.path``) are drawn as arrows,
    one colour each, named by ``labels``; links of U (GPU endpoint links excluded) that two or
    more of them cross are marked in red.
    """
    from matplotlib.patches import FancyArrowPatch
    from matplotlib.path import Path as MplPath

    plt = _plt()
    g = topo.graph
    pos = tree_layout(topo)
    curves = _Curves(topo, pos)
    width = max(x for x, _ in pos.values()) + 1
    depth = -min(y for _, y in pos.values()) + 1
    arch = max(
        (curves.control(lid)[1] for lid in range(len(g.links)) if curves.arched(lid)), default=0.0
    )
    ax = _axes(ax, (min(max(6.0, 0.75 * width), 22.0), 1.1 * (depth + arch / 2) + 1.2))
    model = model or PathModel(topo)
    group_colour = plt.get_cmap("tab10")
    # links: one line per physical link, both directions' rates on it
    done: set[tuple[int, int]] = set()
    for lk in g.links:
        key = (min(lk.src, lk.dst), max(lk.src, lk.dst))
        if key in done:
            continue
        done.add(key)
        back = g.links[g.link(lk.dst, lk.src)]
        pts = curves.points(lk.index)
        style = {"socket": "--", "fabric": ":", "nvlink": "-."}.get(lk.kind, "-")
        ax.plot(pts[:, 0], pts[:, 1], style, color="0.55", lw=1.0, zorder=1)
        if rates:
            text = _rate(lk.gbs) if lk.gbs == back.gbs else f"{_rate(lk.gbs)}/{_rate(back.gbs)}"
            x, y = pts[len(pts) // 2]
            ax.text(
                x,
                y,
                text,
                fontsize=6,
                color="0.3",
                ha="center",
                va="center",
                bbox={"boxstyle": "round,pad=0.1", "fc": "white", "ec": "none", "alpha": 0.8},
                zorder=2,
            )
    # paths, and the modeled links two of them share
    shared = shared_links(topo, paths)
    for lid in shared:
        pts = curves.points(lid)
        ax.plot(
            pts[:, 0], pts[:, 1], color="red", lw=9, alpha=0.3, solid_capstyle="round", zorder=2
        )
    for q, links in enumerate(paths):
        colour = _PATH_COLOURS[q % len(_PATH_COLOURS)]
        for lid in links:
            pts = curves.points(lid, offset=0.07 + 0.06 * q, clip=True)
            arrow = FancyArrowPatch(
                path=MplPath(pts),
                arrowstyle="-|>",
                color=colour,
                lw=1.8,
                alpha=0.9,
                mutation_scale=9,
                zorder=3,
            )
            ax.add_patch(arrow)
        label = labels[q] if q < len(labels) else f"path {q}"
        ax.plot([], [], color=colour, lw=2, label=label)
    if shared:
        ax.plot([], [], color="red", lw=7, alpha=0.3, label="shared link (in U)")
    # devices
    for v, (x, y) in pos.items():
        kind = g.kinds[v]
        if kind == "gpu":
            fc, tc = group_colour(int(model.group_of[g.gpus.index(v)]) % 10), "white"
        else:
            fc, tc = _BOX[kind]
        ax.text(
            x,
            y,
            _label(topo, v),
            ha="center",
            va="center",
            fontsize=7,
            color=tc,
            bbox={"boxstyle": "round,pad=0.3", "fc": fc, "ec": "0.2", "lw": 0.6},
            zorder=4,
        )
    ax.set_xlim(-0.8, width - 0.2)
    ax.set_ylim(-depth + 0.6, max(0.4, arch / 2 + 0.3))
    ax.axis("off")
    if paths:
        ax.legend(loc="upper right", fontsize=7, frameon=False)
    n = topo.nodes
    ax.set_title(
        title
        if title is not None
        else f"{topo.name}: {n} node{'s' * (n > 1)}, {topo.num_ranks} GPUs (link rates GB/s)",
        fontsize=9,
    )
    return ax


# ----- matrices -------------------------------------------------------------------------------
def draw_matrix(
    ax: Axes,
    matrix: np.ndarray,
    *,
    title: str = "",
    blocks: int | None = None,
    fmt: str = "{:.0f}",
    cmap: str = "Blues",
    vmax: float | None = None,
    annotate: bool | None = None,
    axis_label: str = "",
):
    """An annotated heat map of a matrix (rows: sources, columns: destinations); lines every
    ``blocks`` rows and columns (rank groups). A square matrix keeps square cells; any other
    fills its panel (its cells stretched), so a tall (devices × experts) one leaves no blank.
    Returns the image."""
    m = np.asarray(matrix, dtype=float)
    n = max(m.shape)
    top = vmax if vmax is not None else (m.max() if m.size and m.max() > 0 else 1.0)
    square = m.shape[0] == m.shape[1]
    image = ax.imshow(m, cmap=cmap, vmin=0, vmax=top, aspect="equal" if square else "auto")
    if annotate if annotate is not None else n <= 16:
        for (i, j), value in np.ndenumerate(m):
            if value:
                colour = "white" if value > 0.6 * top else "black"
                size = 7 if n <= 8 else 5
                ax.text(
                    j, i, fmt.format(value), ha="center", va="center", fontsize=size, color=colour
                )
    if blocks:
        for k in range(blocks, m.shape[0], blocks):
            ax.axhline(k - 0.5, color="0.4", lw=0.8)
        for k in range(blocks, m.shape[1], blocks):
            ax.axvline(k - 0.5, color="0.4", lw=0.8)
    for count, set_ticks in zip(m.shape, (ax.set_yticks, ax.set_xticks), strict=True):
        set_ticks(np.arange(count) if count <= 16 else np.arange(0, count, max(1, count // 8)))
    ax.tick_params(labelsize=6)
    if axis_label:
        ax.set_xlabel(f"to {axis_label}", fontsize=7)
        ax.set_ylabel(f"from {axis_label}", fontsize=7)
    ax.set_title(title, fontsize=8)
    return image


def plot_iteration(it: PlanIteration, model: PathModel, index: int | None = None) -> Figure:
    """One iteration of Algorithm 2 as the paper's Figure 5 draws it: the remaining demand, its
    aggregation by rank-group pair, the chosen shape M*, the activation (the bound channel's lane
    volumes) and the demand left after it."""
    plt = _plt()
    fig, axes = plt.subplots(1, 5, figsize=(15, 3.4), layout="constrained")
    g = model.group_size or 1
    top = it.remaining.max() / MIB
    draw_matrix(
        axes[0],
        it.remaining / MIB,
        title="remaining demand (MiB)",
        blocks=g,
        vmax=top,
        axis_label="rank",
    )
    draw_matrix(
        axes[1],
        it.aggregated / MIB,
        title="1. aggregated by group (MiB)",
        cmap="Purples",
        axis_label="group",
    )
    score = ""
    if it.scores is not None:
        score = f", s(M*) = {it.scores.max() / MIB:.0f} MiB·lanes"
    draw_matrix(axes[2], it.shape, title=f"2. shape M*{score}", cmap="Greens", axis_label="group")
    draw_matrix(
        axes[3],
        it.served / MIB,
        title="3-4. bound lanes, volumes (MiB)",
        blocks=g,
        cmap="Oranges",
        fmt="{:.1f}",
        axis_label="rank",
    )
    after = it.remaining - it.served
    draw_matrix(
        axes[4],
        after / MIB,
        title=f"5. remaining after ({after.sum() / MIB:.0f} MiB)",
        blocks=g,
        vmax=top,
        axis_label="rank",
    )
    slowest = max(
        (x / (r * 1e9) for x, r in zip(it.volumes, it.rates, strict=True) if x), default=0
    )
    name = "iteration" if index is None else f"iteration {index}"
    fig.suptitle(
        f"{name}: {sum(1 for x in it.volumes if x)} lanes, slowest {slowest * 1e6:.0f} µs, "
        f"utility {it.utility / 1e9:.1f} GB/s, {it.candidates} candidate channel(s)"
        + (" (fallback: one lane)" if it.fallback else ""),
        fontsize=9,
    )
    return fig


def plot_matrices(
    matrices: Sequence[np.ndarray],
    titles: Sequence[str],
    *,
    cols: int = 6,
    suptitle: str = "",
    colorbar: str = "",
    **style,
) -> Figure:
    """Small multiples of :func:`draw_matrix`, ``style`` passed to each (e.g. one ``vmax``)."""
    plt = _plt()
    cols = min(len(matrices), cols)
    rows = -(-len(matrices) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(2.3 * cols, 2.3 * rows + 0.5), squeeze=False)
    image = None
    for ax, m, title in zip(axes.flat, matrices, titles, strict=False):
        image = draw_matrix(ax, m, title=title, **style)
    for ax in axes.flat[len(matrices) :]:
        ax.axis("off")
    if colorbar and image is not None:
        fig.colorbar(image, ax=axes, shrink=0.8, label=colorbar)
    fig.suptitle(suptitle, fontsize=9)
    return fig


def plot_remaining(trace: Sequence[PlanIteration], model: PathModel, panels: int = 12) -> Figure:
    """The remaining demand before each iteration (the first ``panels`` - 2 and the last), on one
    colour scale, and the empty matrix at the end."""
    shown = list(range(len(trace)))
    if len(shown) > panels - 1:
        shown = [*shown[: panels - 2], shown[-1]]
    mats = [trace[k].remaining / MIB for k in shown]
    mats.append((trace[-1].remaining - trace[-1].served) / MIB)
    titles = [f"before {k}: {m.sum():.0f} MiB" for k, m in zip(shown, mats, strict=False)]
    return plot_matrices(
        mats,
        [*titles, "done"],
        suptitle=f"remaining demand over {len(trace)} iterations",
        colorbar="MiB",
        blocks=model.group_size or 1,
        vmax=trace[0].remaining.max() / MIB,
        annotate=False,
    )


# ----- simulations ------------------------------------------------------------------------------
def used_links(topo: Topology, *results: SimResult) -> list[int]:
    """Links with traffic in any of the simulations (recorded with ``record_links``), by link
    kind then id."""
    used: set[int] = set()
    for result in results:
        if result.link_load is None:
            raise ValueError("simulate with record_links=True to see link loads")
        _, loads = result.link_load
        if len(loads):
            used.update(int(v) for v in np.flatnonzero(loads.max(axis=0) > 0))
    g = topo.graph
    return sorted(used, key=lambda lid: (_LINK_KINDS.index(g.links[lid].kind), lid))


def _utilisation(result: SimResult, topo: Topology, links: Sequence[int]):
    """Interval edges (s) and the utilisation of ``links`` in each interval, idle gaps filled."""
    intervals, loads = result.link_load
    cap = np.array([topo.graph.links[lid].gbs for lid in links])
    if not len(intervals):
        return np.zeros(1), np.zeros((len(links), 0))
    edges, rows = [float(intervals[0, 0])], []
    for (t0, t1), load in zip(intervals, loads, strict=True):
        if t0 > edges[-1]:
            rows.append(np.zeros(len(links)))
            edges.append(float(t0))
        rows.append(load[list(links)] / cap)
        edges.append(float(t1))
    return np.array(edges), np.array(rows).T


def draw_link_utilisation(
    ax: Axes,
    result: SimResult,
    topo: Topology,
    links: Sequence[int] | None = None,
    end_s: float | None = None,
):
    """A heat map of each link's utilisation (load / capacity) over time (every used link by
    default); ``end_s`` sets the time axis' end (default: the completion time). Returns the
    mesh (None without traffic)."""
    links = used_links(topo, result) if links is None else list(links)
    end_s = result.completion_s if end_s is None else end_s
    scale, unit = _time_scale(end_s)
    mesh = None
    if links:
        edges, util = _utilisation(result, topo, links)
        mesh = ax.pcolormesh(
            edges * scale,
            np.arange(len(links) + 1),
            util,
            cmap="viridis",
            vmin=0,
            vmax=1,
            shading="flat",
        )
        ax.set_yticks(np.arange(len(links)) + 0.5)
        ax.set_yticklabels([topo.graph.link_name(lid) for lid in links], fontsize=5)
        ax.invert_yaxis()
    ax.set_xlim(0, end_s * scale)
    ax.set_xlabel(f"time ({unit})")
    return mesh


def plot_link_timelines(
    results: Mapping[str, SimResult], topo: Topology, links: Sequence[int]
) -> Figure:
    """Utilisation over time of each of ``links`` (one panel each) under every named result."""
    plt = _plt()
    fig, axes = plt.subplots(
        len(links), 1, figsize=(9, 1.3 * len(links) + 0.8), sharex=True, squeeze=False
    )
    scale, unit = _time_scale(max(r.completion_s for r in results.values()))
    for ax, lid in zip(axes[:, 0], links, strict=True):
        for q, (name, result) in enumerate(results.items()):
            edges, util = _utilisation(result, topo, [lid])
            if util.size:
                ax.stairs(util[0], edges * scale, color=_PATH_COLOURS[q % 7], label=name, lw=1.2)
        ax.set_ylim(0, 1.05)
        ax.set_ylabel("util.", fontsize=7)
        ax.set_title(topo.graph.link_name(lid), fontsize=7, loc="left")
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    handles, names = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, names, fontsize=7, ncol=len(results), loc="upper center", frameon=False)
    axes[-1, 0].set_xlabel(f"time ({unit})")
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.3 / fig.get_figheight()))
    return fig


def plot_completion(
    times: Mapping[str, Mapping[str, float]], bound_s: float, ax: Axes | None = None
) -> Axes:
    """Completion time of every scheduler (rows) under every network model (bars), with the LP
    lower bound as a dashed line and each time's fraction of it."""
    ax = _axes(ax, (8, 0.45 * len(times) + 1.5))
    models = list(dict.fromkeys(m for per in times.values() for m in per))
    height = 0.8 / len(models)
    names = list(times)
    colours = ("#d62728", "#1f77b4", "#2ca02c", "#9467bd")
    scale, unit = _time_scale(max(t for per in times.values() for t in per.values()))
    for k, m in enumerate(models):
        ys = np.arange(len(names)) + (k - (len(models) - 1) / 2) * height
        vals = [times[n].get(m, np.nan) * scale for n in names]
        ax.barh(ys, vals, height, color=colours[k % 4], label=f"network model {m}")
        for y, v in zip(ys, vals, strict=True):
            if np.isfinite(v):
                ax.text(v, y, f" {bound_s * scale / v:.0%}", va="center", fontsize=6)
    ax.axvline(bound_s * scale, color="k", ls="--", lw=1, label="LP lower bound")
    ax.set_yticks(np.arange(len(names)), names, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel(f"completion time ({unit}); labels: bound / time")
    ax.legend(fontsize=7, loc="lower right")
    ax.grid(axis="x", alpha=0.3)
    return ax


def transfer_dependencies(schedule: Schedule) -> list[list[int]]:
    """For every transfer (flat schedule order), the transfers it waits for: its ``after``
    references and every transfer of the steps its step depends on."""
    first = np.concatenate([[0], np.cumsum([len(st.transfers) for st in schedule.steps])])
    out = []
    for s, st in enumerate(schedule.steps):
        barrier = [f for d in schedule.dependencies(s) for f in range(first[d], first[d + 1])]
        for t in st.transfers:
            out.append(sorted({*barrier, *(int(first[a] + k) for a, k in t.after)}))
    return out


def plot_timeline(
    schedule: Schedule, result: SimResult, ax: Axes | None = None, dependencies: bool = True
) -> Axes:
    """Every transfer as a bar on its source rank's row, coloured by step and labelled with its
    destination, from when it could start (its step begun, the transfers it waits for ended) to
    when it ended in the simulation; grey arrows from each dependency's end."""
    plt = _plt()
    ax = _axes(ax, (10, 0.4 * schedule.ranks + 1.5))
    flat = [(s, t) for s, st in enumerate(schedule.steps) for t in st.transfers]
    deps = transfer_dependencies(schedule)
    end = result.transfer_end
    scale, unit = _time_scale(result.completion_s)
    cmap = plt.get_cmap("tab20")
    for f, (s, t) in enumerate(flat):
        ready = max([float(result.step_start[s]), *(float(end[d]) for d in deps[f])])
        width = max(float(end[f]) - ready, 0.0)
        ax.barh(
            t.src,
            width * scale,
            left=ready * scale,
            height=0.7,
            color=cmap(s % 20),
            ec="0.2",
            lw=0.3,
        )
        ax.text(
            (ready + width / 2) * scale, t.src, str(t.dst), ha="center", va="center", fontsize=5
        )
        if dependencies:
            for d in deps[f]:
                ax.annotate(
                    "",
                    (ready * scale, t.src),
                    (float(end[d]) * scale, flat[d][1].src),
                    arrowprops={"arrowstyle": "->", "color": "0.5", "lw": 0.4, "alpha": 0.6},
                )
    ax.set_yticks(range(schedule.ranks))
    ax.set_ylabel("source rank")
    ax.set_xlabel(f"time ({unit}); bar labels: destination rank; colour: step")
    ax.invert_yaxis()
    ax.grid(axis="x", alpha=0.3)
    return ax


# ----- the optimality gap ---------------------------------------------------------------------
def plot_gap(rows: Sequence, ax: Axes | None = None, title: str = "") -> Axes:
    """The paper's Figure 12 from ``solver.gap.run_gap`` rows: mean algorithmic bandwidth
    (payload per rank / time) per size of VarioPath, of the epoch model's optimum (solid where
    every instance was proven, hatched otherwise) and of the best channel schedule found, with a
    whisker up to the bandwidth at the proven channel-model bound (the channel optimum lies in
    between), the flow-LP bound as a dashed line, and the mean VarioPath/epoch ratio on the
    right axis."""
    ax = _axes(ax, (7.5, 3.8))
    sizes = sorted({r.mib_per_rank for r in rows})
    x = np.arange(len(sizes))

    def mean_bw(group, field: str) -> float:
        return float(np.mean([r.mib_per_rank * MIB / getattr(r, field) / 1e9 for r in group]))

    def once(label: str) -> str | None:
        """A legend label the first time it is drawn."""
        new = label not in seen
        seen.add(label)
        return label if new else None

    seen: set[str] = set()
    width = 0.27
    for k, size in enumerate(sizes):
        group = [r for r in rows if r.mib_per_rank == size]
        proven = sum(r.epoch_status == "OPTIMAL" for r in group)
        certified = proven == len(group)
        epoch = mean_bw(group, "epoch_opt_s")
        best, ceiling = mean_bw(group, "channel_best_s"), mean_bw(group, "channel_bound_s")
        ax.bar(
            k - width,
            mean_bw(group, "variopath_s"),
            width,
            color="#d62728",
            label=once("VarioPath (Algorithm 2)"),
        )
        ax.bar(
            k,
            epoch,
            width,
            color="#1f77b4" if certified else "white",
            ec="#1f77b4",
            hatch=None if certified else "//",
            label=once("epoch model: proven optimal" if certified else "epoch model: best found"),
        )
        ax.bar(k + width, best, width, color="#2ca02c", label=once("channel model: best found"))
        ax.errorbar(
            k + width, best, yerr=[[0], [max(ceiling - best, 0)]], color="k", capsize=3, lw=0.8
        )
        ax.hlines(
            mean_bw(group, "bound_s"),
            k - 1.5 * width,
            k + 1.5 * width,
            colors="k",
            linestyles="--",
            lw=1,
            label=once("flow-LP bound"),
        )
        gap = np.mean([r.channel_gap for r in group])
        note = "proven\noptimal" if certified else f"{proven}/{len(group)}\nproven"
        ax.text(k, epoch, note, ha="center", va="bottom", fontsize=6)
        ax.text(
            k + width, max(best, ceiling), f"gap\n≤ {gap:.0%}", ha="center", va="bottom", fontsize=6
        )
    ax.set_xticks(x, [f"{s:g}" for s in sizes])
    ax.set_xlabel("MiB per rank")
    ax.set_ylabel("algbw (GB/s)")
    ax.set_xlim(-0.7, len(sizes) - 0.3)
    ax.set_ylim(0, ax.get_ylim()[1] * 1.15)
    right = ax.twinx()
    ratio = [np.mean([r.ratio for r in rows if r.mib_per_rank == s]) for s in sizes]
    right.plot(x, ratio, "o:", color="0.3", ms=4, lw=1, label="VarioPath / epoch (right)")
    right.set_ylim(0, max(1.1, max(ratio) * 1.1))
    right.set_ylabel("VarioPath / epoch optimum")
    handles = [h for a in (ax, right) for h in a.get_legend_handles_labels()[0]]
    names = [n for a in (ax, right) for n in a.get_legend_handles_labels()[1]]
    ax.legend(
        handles,
        names,
        fontsize=7,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.16),
        ncol=3,
        frameon=False,
    )
    ax.set_title(title, fontsize=9)
    return ax
