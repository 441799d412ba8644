"""The notebooks' helpers: variopath_jax.explore (shared links, a family's lanes and binding,
unrealizable shapes, the planner trace, the op's executed schedule) and the pictures of
variopath_jax.viz (drawn on the Agg backend)."""

from __future__ import annotations

from itertools import pairwise

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
import pytest
from ortools.sat.python import cp_model

from variopath_jax import viz, workloads
from variopath_jax.catalog import build_catalog, get_catalog
from variopath_jax.explore import (
    bind_family,
    busiest_links,
    endpoint_link,
    executed_schedule,
    family_routes,
    shared_links,
    trace_plan,
    unrealizable_shapes,
)
from variopath_jax.planner import PlannerParams, ReferencePlanner
from variopath_jax.runner import run_one
from variopath_jax.schedule import signal_driven
from variopath_jax.sim import FluidSimulator
from variopath_jax.solver.gap import GapRow
from variopath_jax.solver.verify import shape_realizable
from variopath_jax.topology import PathModel, preset


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def names(topo, links) -> list[str]:
    return [topo.graph.link_name(lid) for lid in links]


# ----- explore ----------------------------------------------------------------------------------
def test_shared_links_are_the_modeled_links_two_paths_cross() -> None:
    topo = preset("r5080-bf3")
    model = PathModel(topo)
    pxb = [model.paths(0, 2)[0], model.paths(1, 3)[0]]
    assert [p.cls for p in pxb] == ["PXB", "PXB"]
    assert names(topo, shared_links(topo, [p.links for p in pxb])) == [
        "n0/sw0->n0/top0",
        "n0/top0->n0/sw1",
    ]
    # the same sender's two paths share its own link to the switch: not a resource of U
    own = [model.paths(0, 2)[0].links, model.paths(0, 3)[0].links]
    up, _ = model.endpoint_links(0)
    assert endpoint_link(topo, up) and up not in shared_links(topo, own)
    assert "n0/sw0->n0/top0" in names(topo, shared_links(topo, own))
    assert shared_links(topo, [pxb[0].links]) == []


def test_family_routes_and_binding_instantiate_a_channel() -> None:
    topo = preset("fig1")
    model = PathModel(topo)
    catalog = build_catalog(topo)
    for f, family in enumerate(catalog.families):
        routes = family_routes(catalog, family)
        assert len(routes) == topo.num_ranks
        used = [lid for r in routes for lid in r.links]
        assert len(used) == len(set(used))  # footprints pairwise disjoint
        shape = np.zeros((2, 2), dtype=int)
        for r in routes:
            shape[r.src_group, r.dst_group] += 1
        assert shape.tolist() == catalog.shapes[catalog.family_shape[f]].tolist()
        channel = bind_family(model, routes)
        assert sorted(p.src for p in channel) == sorted(p.dst for p in channel) == list(range(6))
        assert all(p.src != p.dst for p in channel)
        assert shared_links(topo, [p.links for p in channel]) == []


def test_unrealizable_shapes_are_the_balanced_shapes_the_catalog_lacks() -> None:
    fig1 = build_catalog(preset("fig1"))
    assert [s.tolist() for s in unrealizable_shapes(fig1)] == [[[0, 3], [3, 0]]]  # Figure 4's M1
    topo = preset("r5080-bf3")
    model = PathModel(topo)
    missing = unrealizable_shapes(build_catalog(topo))
    assert len(missing) == 9  # of 282 admissible shapes (docs/solver.md)
    assert all(s.sum(axis=0).tolist() == [2] * 4 == s.sum(axis=1).tolist() for s in missing)
    routes = {(a, d): model.unpruned_routes(a, d) for a in range(4) for d in range(4)}
    assert shape_realizable(routes, missing[0]) == cp_model.INFEASIBLE


@pytest.mark.parametrize("nodes", [1, 2], ids=["flat", "factored"])
def test_trace_plan_is_the_planners_plan(nodes: int) -> None:
    topo = preset("r5080-bf3", nodes)
    model = PathModel(topo)
    demand = workloads.moe(topo.num_ranks, 64, experts=32, top_k=4, seed=3)
    planner = ReferencePlanner(get_catalog(topo), model, PlannerParams(lambda_s=20e-6))
    trace = trace_plan(planner, demand)
    assert [it.step for it in trace] == planner.plan(demand).steps
    assert np.array_equal(trace[0].remaining, demand)
    assert np.array_equal(sum(it.served for it in trace), demand)
    for before, after in pairwise(trace):
        assert np.array_equal(before.remaining - before.served, after.remaining)
    g = model.group_of
    for it in trace:
        dhat = np.zeros_like(it.aggregated)
        np.add.at(dhat, (g[:, None], g[None, :]), it.remaining)
        assert np.array_equal(dhat, it.aggregated)
        assert it.shape.sum() == len(it.pairs) == len(it.volumes) == len(it.rates)
        assert (it.scores is not None) == (nodes == 1)
        if it.scores is not None and not it.fallback:  # M* is the shape of highest pressure
            best = planner.catalog.shapes[int(np.argmax(it.scores))]
            assert np.array_equal(best, it.shape)


def fake_log(schedule) -> dict:
    """A ``last_schedule()`` record of a schedule executed exactly as planned."""
    flat = [t for st in schedule.steps for t in st.transfers]
    first = np.cumsum([0] + [len(st.transfers) for st in schedule.steps])
    after = [[int(first[s] + k) for s, k in t.after] for t in flat]
    return {
        "step_ptr": first,
        "src": np.array([t.src for t in flat]),
        "dst": np.array([t.dst for t in flat]),
        "bytes": np.array([t.nbytes for t in flat]),
        "after_ptr": np.cumsum([0] + [len(a) for a in after]),
        "after": np.array([a for deps in after for a in deps], dtype=np.int64),
        "pace_gbs": np.zeros(len(flat)),
    }


def test_executed_schedule_replays_the_logged_dependencies() -> None:
    topo = preset("r5080-bf3")
    model = PathModel(topo)
    demand = workloads.zipf(8, 0.6, 1 << 20, seed=1)
    planned = signal_driven(run_one(model, "variopath-paper", demand).schedule)
    log = fake_log(planned)
    assert executed_schedule(log, planned).steps == planned.steps
    # the op's dependencies and pacing replace the plan's
    log["after_ptr"] = np.zeros_like(log["after_ptr"])
    log["after"] = np.zeros(0, dtype=np.int64)
    log["pace_gbs"][0] = 1.5
    mine = executed_schedule(log, planned)
    assert all(not t.after for st in mine.steps for t in st.transfers)
    assert mine.steps[0].transfers[0].rate == 1.5
    sim = FluidSimulator(topo, "none")
    assert sim.run(mine).completion_s != sim.run(planned).completion_s
    log["bytes"][3] += 1
    with pytest.raises(ValueError, match="transfer 3: the op moved"):
        executed_schedule(log, planned)
    log["step_ptr"] = log["step_ptr"][:-1]
    with pytest.raises(ValueError, match="steps of"):
        executed_schedule(log, planned)


def test_busiest_links_leave_out_endpoint_links() -> None:
    topo = preset("r5080-bf3")
    demand = workloads.uniform(8, 1 << 20)
    result = run_one(PathModel(topo), "nccl", demand, record_links=True).sim
    busy = busiest_links(result, topo, 3)
    assert len(busy) == 3 and not any(endpoint_link(topo, lid) for lid in busy)
    intervals, loads = result.link_load
    carried = (loads * np.diff(intervals, axis=1)).sum(axis=0)
    assert list(carried[busy]) == sorted(carried[busy], reverse=True)
    with pytest.raises(ValueError, match="record_links"):
        busiest_links(run_one(PathModel(topo), "nccl", demand).sim, topo)


# ----- viz ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("name, nodes", [("r5080-bf3", 2), ("r5090-bf3", 1), ("fig1", 1)])
def test_tree_layout_puts_parents_above_children(name: str, nodes: int) -> None:
    topo = preset(name, nodes)
    pos = viz.tree_layout(topo)
    g = topo.graph
    assert sorted(pos) == list(range(len(g.vertices)))
    for v, p in enumerate(g.parent):
        if p >= 0:
            assert pos[p][1] == pos[v][1] + 1
        elif g.kinds[v] == "cpu":
            assert pos[v][1] == 0
    leaves = [pos[v] for v in range(len(g.vertices)) if g.kinds[v] in ("gpu", "nic")]
    assert len(set(leaves)) == len(leaves)
    assert pos[g.net][1] < min(y for x, y in leaves)


def test_draw_topology_draws_devices_paths_and_shared_links() -> None:
    topo = preset("r5090-bf3")  # with a ring of switch-to-switch links
    model = PathModel(topo)
    paths = [model.paths(0, 4)[0].links, model.paths(1, 5)[0].links]
    ax = viz.draw_topology(topo, model=model, paths=paths, labels=["a", "b"])
    texts = {t.get_text() for t in ax.texts}
    assert {"CPU0", "sw3", "GPU 15", "nic7", "net"} <= texts
    labels = ax.get_legend_handles_labels()[1]
    assert labels == ["a", "b", "shared link (in U)"]
    assert sum(len(lids) for lids in paths) == len(ax.patches)  # one arrow per directed link
    plain = viz.draw_topology(preset("fig1"), rates=False, title="x")
    assert plain.get_legend() is None and plain.get_title() == "x"
    assert not any(t.get_text() == "64" for t in plain.texts)


def test_plot_iteration_and_remaining() -> None:
    topo = preset("r5080-bf3")
    model = PathModel(topo)
    demand = workloads.moe(8, 64, experts=32, top_k=4, seed=0)
    planner = ReferencePlanner(get_catalog(topo), model, PlannerParams(lambda_s=20e-6))
    trace = trace_plan(planner, demand)
    fig = viz.plot_iteration(trace[0], model, 0)
    assert len(fig.axes) == 5 and "iteration 0" in fig._suptitle.get_text()
    fig = viz.plot_remaining(trace, model, panels=4)
    shown = [ax.get_title() for ax in fig.axes if ax.get_title()]
    assert shown[0].startswith("before 0") and shown[-1] == "done" and len(shown) == 4


def test_link_plots_and_completion() -> None:
    topo = preset("r5080-bf3")
    model = PathModel(topo)
    demand = workloads.uniform(8, 256 << 10)
    runs = {s: run_one(model, s, demand, record_links=True).sim for s in ("nccl", "pairwise")}
    links = viz.used_links(topo, *runs.values())
    assert set(viz.used_links(topo, runs["nccl"])) <= set(links)
    _, ax = plt.subplots()
    mesh = viz.draw_link_utilisation(ax, runs["nccl"], topo)
    assert mesh is not None and ax.get_xlabel() == "time (µs)"  # 1.4 ms: drawn in µs
    fig = viz.plot_link_timelines(runs, topo, links[:3])
    assert len(fig.axes) == 3
    times = {s: {"pcie": r.completion_s, "none": r.completion_s / 2} for s, r in runs.items()}
    ax = viz.plot_completion(times, runs["nccl"].completion_s / 4)
    assert len(ax.patches) == 4 and "LP lower bound" in ax.get_legend_handles_labels()[1]


def test_plot_timeline_and_dependencies() -> None:
    topo = preset("r5080-bf3")
    demand = workloads.zipf(8, 0.6, 1 << 20, seed=2)
    barrier = run_one(PathModel(topo), "variopath-paper", demand).schedule
    deps = viz.transfer_dependencies(barrier)
    sizes = [len(st.transfers) for st in barrier.steps]
    assert deps[: sizes[0]] == [[]] * sizes[0]
    assert deps[sizes[0]] == list(range(sizes[0]))  # a barrier: every transfer before
    signal = signal_driven(barrier)
    flat = [t for st in signal.steps for t in st.transfers]
    for k, waits in enumerate(viz.transfer_dependencies(signal)):  # its sender, receiver, links
        for u in waits:
            a, b = flat[u], flat[k]
            assert u < k and (a.src == b.src or a.dst == b.dst or set(a.path) & set(b.path))
    result = FluidSimulator(topo, "pcie").run(signal)
    ax = viz.plot_timeline(signal, result)
    assert len(ax.patches) == signal.num_transfers


def gap_row(size: float, status: str, gap: float, ratio: float) -> GapRow:
    """An instance where VarioPath takes 1 ms, the epoch optimum ``ratio`` of that and the best
    channel schedule 0.9 ms, ``gap`` above its bound."""
    best = 0.9e-3
    return GapRow(
        mib_per_rank=size,
        seed=0,
        variopath_s=1e-3,
        variopath_tuned_s=0.8e-3,
        variopath_activations=4,
        epoch_opt_s=1e-3 * ratio,
        epoch_status=status,
        epoch_s=1e-4,
        epoch_bound_s=1e-3 * ratio * (1 if status == "OPTIMAL" else 0.9),
        epoch_sim_s=1e-3 * ratio,
        epochs=5,
        epoch_seconds=1.0,
        channel_best_s=best,
        channel_bound_s=best * (1 - gap),
        channel_gap=gap,
        channel_solver="kslot",
        channel_status="FEASIBLE",
        channel_source="kslot",
        channel_seconds=1.0,
        bound_s=0.5e-3,
        ratio=ratio,
        ratio_tuned=ratio / 0.8,
        variopath_of_channel=0.9,
        variopath_of_bound=0.5,
    )


def test_plot_gap_labels_best_found_and_proven() -> None:
    rows = [gap_row(8, "OPTIMAL", 0.0, 0.9), gap_row(32, "FEASIBLE", 0.25, 1.0)]
    ax = viz.plot_gap(rows, title="t")
    labels = ax.get_legend().get_texts()
    assert {"epoch model: proven optimal", "epoch model: best found"} <= {
        t.get_text() for t in labels
    }
    notes = [t.get_text() for t in ax.texts]
    assert notes == ["proven\noptimal", "gap\n≤ 0%", "0/1\nproven", "gap\n≤ 25%"]
    hatched = [p.get_hatch() for p in ax.patches]
    assert hatched.count("//") == 1
