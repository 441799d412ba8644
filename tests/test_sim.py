"""The fluid simulator against hand-computed cases, a straightforward reference simulator, and the
exact simulation (for the coalescing bound)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from helpers import lane, schedule

from variopath_jax import _native, workloads
from variopath_jax.planner import PlannerParams
from variopath_jax.planner.schedulers import chooser_for
from variopath_jax.schedule import Schedule, ScheduleError, Step
from variopath_jax.schedulers import PlanRequest, get_scheduler
from variopath_jax.sim import (
    DEFAULT_COALESCE,
    DEFAULT_LAMBDA_S,
    PCIE,
    PCIE_FAIR,
    FluidSimulator,
    legacy_model,
    max_min_rates,
)
from variopath_jax.sim.network import LINK_CLASSES, link_classes
from variopath_jax.topology import PathModel, Topology, preset

MB = 10**6
IDEAL = legacy_model(0.0, 0.0)  # perfect sharing, no per-message cost, no barrier cost


@pytest.fixture(scope="module")
def fig1() -> PathModel:
    return PathModel(preset("fig1"))


@pytest.fixture(scope="module")
def bf3x2() -> PathModel:
    return PathModel(preset("r5080-bf3", 2))


@pytest.fixture(params=[0.0, DEFAULT_COALESCE], ids=["exact", "coalesced"])
def coalesce(request: pytest.FixtureRequest) -> float:
    """The hand-computed cases hold with and without coalescing."""
    return request.param


def reference_fair(
    active: np.ndarray,
    flow_cap: np.ndarray,
    entry_flow: np.ndarray,
    entry_link: np.ndarray,
    link_cap: np.ndarray,
) -> np.ndarray:
    """Progressive filling over every (flow, link) entry at every level: the plain algorithm."""
    rate = np.zeros(len(flow_cap))
    unfrozen = active.copy()
    residual = link_cap.astype(np.float64).copy()
    level = 0.0
    while unfrozen.any():
        live = unfrozen[entry_flow]
        count = np.bincount(entry_link[live], minlength=len(link_cap))
        used = count > 0
        step = float((residual[used] / count[used]).min()) if used.any() else np.inf
        step = max(min(step, float(flow_cap[unfrozen].min()) - level), 0.0)
        level += step
        residual -= step * count
        saturated = used & (residual <= 1e-9 * link_cap)
        freeze = unfrozen & (flow_cap <= level * (1 + 1e-9))
        freeze[entry_flow[live & saturated[entry_link]]] = True
        rate[freeze] = level
        unfrozen &= ~freeze
    return rate


def pushed_target(topo: Topology, t, lid: int) -> str | None:
    """The root complex that transfer ``t`` writes toward on link ``lid``, written plainly from
    the model's definition (DESIGN.md "Network model"), or None: ``lid`` is no uplink into a
    root port, or ``t`` does not push there (a NIC reading what it sends, a pull)."""
    g, root = topo.graph, ("cpu", "hostbridge")
    lk = g.links[lid]
    if not (lk.kind == "pcie" and g.kinds[lk.dst] in root and g.kinds[lk.src] not in root):
        return None

    def complex_of(vertex: int) -> str:
        return topo.node.root_complex_of(g.vertices[vertex].split("/", 1)[1])

    if t.staged:  # DMA into host memory behind the writer's own root complex
        return complex_of(lk.src)
    later = [g.links[m] for m in t.path[t.path.index(lid) + 1 :]]
    if any(m.kind == "nic" and g.kinds[m.src] == "nic" for m in later):
        return None  # on its way out through a NIC, which reads it
    if t.pull:
        return None
    down = [m for m in later if g.kinds[m.src] in root and g.kinds[m.dst] not in root]
    return complex_of(down[0].dst) if down else complex_of(lk.src)


def contended_capacity(
    topo: Topology, network, flows: list, active: np.ndarray, link_cap: np.ndarray
) -> np.ndarray:
    """Link capacities under ``network``'s contention with the ``active`` flows, written plainly
    from the model's definition, link by link: oversubscribed when the caps exceed the capacity,
    or when a rule that applies (root links: root_p2p's while they carry P2P, root_dma's while
    they carry staged flows) is not paced-lossless and two or more flows share the link; η the
    lowest of the rules that apply; an uplink whose pushed writes target two or more root
    complexes keeps at most the trigger factor of its capacity."""
    if not network.contended:
        return link_cap
    names = list(LINK_CLASSES)
    classes = link_classes(topo)
    factor = network.trigger_factor_for(topo)
    cap = link_cap.copy()
    for lid in range(len(cap)):
        on = [t for (_, t), a in zip(flows, active, strict=True) if a and lid in t.path]
        if factor is not None:
            targets = {pushed_target(topo, t, lid) for t in on} - {None}
            if len(targets) >= 2:
                cap[lid] = link_cap[lid] * factor
        if classes[lid] < 0:
            continue
        name = names[classes[lid]]
        rules = [name]
        if name == "root_p2p":
            rules = ["root_p2p"] * any(not t.staged for t in on) + ["root_dma"] * any(
                t.staged for t in on
            )
        strict = any(not network.paced_lossless(r) for r in rules) and len(on) >= 2
        if not strict and sum(t.rate * 1e9 for t in on) <= link_cap[lid] * (1 + 1e-9):
            continue
        eta = min(float(network.efficiency(r, len(on))) for r in rules)
        cap[lid] = min(cap[lid], link_cap[lid] * eta)
    return cap


def reference_run(schedule: Schedule, topo: Topology, network) -> tuple[np.ndarray, ...]:
    """A straightforward exact simulation that re-solves every rate, and every link's capacity,
    at every event (barrier steps in sequence, every post at once: issue overhead as a delay, no
    latency).

    Returns (step_start, step_end, transfer_end).
    """
    alpha_s = network.issue_s
    flows = [(s, t) for s, st in enumerate(schedule.steps) for t in st.transfers]
    n_steps = len(schedule.steps)
    step_of = np.array([s for s, _ in flows], dtype=int)
    nbytes = np.array([t.nbytes for _, t in flows], dtype=float)
    flow_cap = np.array([t.rate * 1e9 for _, t in flows])
    entry_flow = np.repeat(np.arange(len(flows)), [len(t.path) for _, t in flows])
    entry_link = np.array([lid for _, t in flows for lid in t.path], dtype=int)
    link_cap = np.array([lk.gbs * 1e9 for lk in topo.graph.links])
    deps = [list(schedule.dependencies(s)) for s in range(n_steps)]
    # when each step starts and when its transfers begin (empty steps end when they start)
    start, begin = np.full(n_steps, np.nan), np.full(n_steps, np.nan)
    step_end = np.full(n_steps, np.nan)
    end = np.full(len(flows), np.nan)
    left = nbytes.copy()
    active = np.zeros(len(flows), dtype=bool)
    t = 0.0
    while True:
        for s in range(n_steps):  # settle everything due at t, steps in order
            if np.isnan(start[s]) and not np.isnan(step_end[deps[s]]).any():
                start[s] = max(step_end[deps[s]], default=0.0) + network.barrier_s
                begin[s] = start[s] + (alpha_s if schedule.steps[s].transfers else 0.0)
            mine = step_of == s
            if begin[s] <= t and not (active[mine].any() or (~np.isnan(end[mine])).any()):
                active |= mine & (nbytes > 0)
                end[mine & (nbytes <= 0)] = begin[s]
            if np.isnan(step_end[s]) and begin[s] <= t and not np.isnan(end[mine]).any():
                step_end[s] = max(end[mine], default=start[s])
        if not np.isnan(step_end).any():
            return start, step_end, end
        caps = contended_capacity(topo, network, flows, active, link_cap)
        rate = reference_fair(active, flow_cap, entry_flow, entry_link, caps)
        with np.errstate(divide="ignore", invalid="ignore"):
            finish = np.where(active, t + left / rate, np.inf)
        t_next = min(finish.min(), begin[begin > t].min(initial=np.inf))
        left[active] -= rate[active] * (t_next - t)
        t = t_next
        done = active & ((left <= 1e-9 * nbytes + 1e-6) | (finish <= t + 4 * np.spacing(t)))
        end[done] = t
        active &= ~done


def moe_schedule(
    model: PathModel, scheduler: str, tokens: int = 128, seed: int = 0, network=None
) -> Schedule:
    demand = workloads.moe(model.topology.num_ranks, tokens, seed=seed)
    return get_scheduler(scheduler).plan(
        PlanRequest(demand, model, DEFAULT_LAMBDA_S, network=network)
    )


def test_max_min_progressive_filling() -> None:
    # links: 0 (cap 10), 1 (cap 4); flows: a uses 0, b uses 0 and 1, c uses 1, d uses 0 capped at 1
    entry_flow = np.array([0, 1, 1, 2, 3])
    entry_link = np.array([0, 0, 1, 1, 0])
    rates = max_min_rates(
        np.ones(4, dtype=bool),
        np.array([np.inf, np.inf, np.inf, 1.0]),
        entry_flow,
        entry_link,
        np.array([10.0, 4.0]),
    )
    # link 1 saturates first at 2 each (b, c); d stops at its cap 1; a takes the rest of link 0: 10-2-1
    assert rates == pytest.approx([7.0, 2.0, 2.0, 1.0])
    inactive = max_min_rates(
        np.array([True, False, True, True]),
        np.full(4, np.inf),
        entry_flow,
        entry_link,
        np.array([10.0, 4.0]),
    )
    assert inactive == pytest.approx([5.0, 0.0, 4.0, 5.0])


def test_shared_link_then_release(fig1, coalesce) -> None:
    # 0->3 and 1->4 share the PXB links: 32 GB/s each until the smaller finishes
    sch = schedule(fig1, [[lane(fig1, 0, 3, "PXB", 32 * MB), lane(fig1, 1, 4, "PXB", 64 * MB)]])
    res = FluidSimulator(fig1.topology, IDEAL, coalesce=coalesce).run(sch)
    assert res.transfer_end == pytest.approx(
        [1e-3, 1.5e-3]
    )  # 32 MB at 32 GB/s; then 32 MB at 64 GB/s
    assert [round(r, 6) for _, _, r in res.throughput] == [64.0, 64.0]


def test_fair_share_respects_path_caps(fig1, coalesce) -> None:
    slow = dataclasses.replace(lane(fig1, 0, 3, "PXB", 10 * MB), rate=10.0)
    sch = schedule(
        fig1, [[slow, lane(fig1, 1, 4, "PXB", 27 * MB), lane(fig1, 2, 5, "PXB", 27 * MB)]]
    )
    res = FluidSimulator(fig1.topology, IDEAL, coalesce=coalesce).run(sch)
    assert res.throughput[0][2] == pytest.approx(64.0)
    assert res.transfer_end == pytest.approx(
        [1e-3, 1e-3, 1e-3]
    )  # 10 + 27 + 27 share the 64 GB/s link


def test_endpoint_links_are_shared_too(fig1, coalesce) -> None:
    # two flows into GPU 3 (PIX from 4 and PXB from 0) share the sw1->gpu3 endpoint link
    sch = schedule(fig1, [[lane(fig1, 4, 3, "PIX", 32 * MB), lane(fig1, 0, 3, "PXB", 32 * MB)]])
    res = FluidSimulator(fig1.topology, IDEAL, coalesce=coalesce).run(sch)
    assert res.completion_s == pytest.approx(1e-3)


def test_dependencies_lambda_and_alpha(fig1, coalesce) -> None:
    a = lane(fig1, 0, 3, "PXB", 64 * MB)  # 1 ms alone
    b = lane(fig1, 2, 5, "NIC", 50 * MB)  # 1 ms alone
    c = lane(fig1, 4, 1, "PXB", 64 * MB)
    lam, alpha = 5e-6, 2e-6
    sim = FluidSimulator(fig1.topology, legacy_model(alpha, lam), coalesce=coalesce)
    # default dependencies: a sequence
    seq = dataclasses.replace(schedule(fig1, [[a], [b], [c]]), lambda_s=lam)
    res = sim.run(seq)
    assert res.step_start == pytest.approx(
        [lam, lam + alpha + 1e-3 + lam, 2 * (lam + alpha + 1e-3) + lam]
    )
    assert res.completion_s == pytest.approx(3 * (lam + alpha + 1e-3))
    # step 1 depends on nothing: it runs beside step 0; step 2 waits for step 1 only
    par = dataclasses.replace(schedule(fig1, [[a], [b], [c]], deps=[(), (), (1,)]), lambda_s=lam)
    res = sim.run(par)
    assert res.step_start[1] == pytest.approx(lam)
    assert res.completion_s == pytest.approx(2 * (lam + alpha + 1e-3))


def test_contention_free_schedule_runs_at_modeled_time(bf3x2, coalesce) -> None:
    """Steps whose lanes share no link simulate to exactly Σ (λ + α + slowest lane)."""
    model = bf3x2
    rng = np.random.default_rng(0)
    steps = []
    for _ in range(5):
        perm = rng.permutation(16)
        lanes = []
        used: set[int] = set()
        for i, j in enumerate(perm):
            if i == j:
                continue
            for r in model.routes(int(model.group_of[i]), int(model.group_of[j])):
                if not (r.footprint & used):
                    used |= r.footprint
                    lanes.append(lane(model, i, int(j), r.cls, int(rng.integers(1, 64)) * MB))
                    break
        steps.append(lanes)
    sch = dataclasses.replace(schedule(model, steps, kind="channel"), lambda_s=7e-6)
    res = FluidSimulator(model.topology, legacy_model(3e-6, 7e-6), coalesce=coalesce).run(sch)
    assert res.completion_s == pytest.approx(sch.modeled_time(3e-6), rel=1e-12)
    # and so do the channel schedules the planner makes
    sch = get_scheduler("variopath-paper").plan(
        PlanRequest(workloads.moe(16, 64, seed=3), model, DEFAULT_LAMBDA_S)
    )
    legacy = legacy_model(2e-6, DEFAULT_LAMBDA_S)
    res = FluidSimulator(model.topology, legacy, coalesce=coalesce).run(sch)
    assert res.completion_s == pytest.approx(sch.modeled_time(2e-6), rel=1e-12)


def test_empty_schedule_and_algbw(fig1, coalesce) -> None:
    empty = Schedule(6, [], fig1.topology.fingerprint, 1e-5)
    res = FluidSimulator(fig1.topology, coalesce=coalesce).run(empty)
    assert res.completion_s == 0 and res.algbw_gbps == 0
    sch = schedule(fig1, [[lane(fig1, 0, 1, "PIX", 64 * MB)]])
    res = FluidSimulator(fig1.topology, IDEAL, coalesce=coalesce).run(sch)
    assert res.algbw_gbps == pytest.approx(64 * MB / (6 * 1e-3) / 1e9)


def test_link_recording(fig1, coalesce) -> None:
    sch = schedule(fig1, [[lane(fig1, 0, 3, "PXB", 32 * MB), lane(fig1, 1, 4, "PXB", 64 * MB)]])
    res = FluidSimulator(fig1.topology, IDEAL, record_links=True, coalesce=coalesce).run(sch)
    intervals, loads = res.link_load
    uplink = fig1.graph.link(fig1.graph.index["n0/sw0"], fig1.graph.index["n0/sw"])
    assert intervals.shape == (2, 2) and loads[:, uplink] == pytest.approx([64.0, 64.0])


def test_wrong_topology_is_refused(fig1) -> None:
    sch = schedule(fig1, [[lane(fig1, 0, 1, "PIX", MB)]])
    with pytest.raises(ScheduleError, match="topology"):
        FluidSimulator(preset("fig1", 2)).run(sch)


def test_max_min_rates_match_plain_filling() -> None:
    """Random instances with ties, flow caps and a path crossing a link twice."""
    rng = np.random.default_rng(1)
    for trial in range(40):
        n_flows, n_links = int(rng.integers(1, 30)), int(rng.integers(1, 12))
        path_len = rng.integers(0 if trial % 5 == 0 else 1, 5, n_flows)
        entry_flow = np.repeat(np.arange(n_flows), path_len)
        entry_link = rng.integers(0, n_links, len(entry_flow))
        link_cap = rng.integers(1, 5, n_links).astype(float) * 10  # few values: ties
        flow_cap = np.where(rng.random(n_flows) < 0.3, rng.integers(1, 20, n_flows), np.inf)
        flow_cap[path_len == 0] = rng.integers(1, 20)  # a flow crossing nothing stops at its cap
        active = rng.random(n_flows) < 0.8
        args = (active, flow_cap, entry_flow, entry_link, link_cap)
        assert max_min_rates(*args) == pytest.approx(reference_fair(*args), rel=1e-9)


def paced(model: PathModel, demand: np.ndarray, lambda_s: float) -> Schedule:
    """The C++ core's paced plan of ``demand`` (the deployment's reference split): one step of
    paced transfers whose caps fit every link."""
    chooser = chooser_for(model, PlannerParams(lambda_s=lambda_s))
    sch = chooser.apply(_native.Decision("paced"), demand, (PCIE,))
    assert sch.meta["plan"] == "paced" and len(sch.steps) == 1
    return sch


def pipelined(sch: Schedule) -> Schedule:
    """The same steps with two in flight at once (step s waits for step s - 2 only)."""
    steps = [Step(st.transfers, (s - 2,) if s >= 2 else ()) for s, st in enumerate(sch.steps)]
    return dataclasses.replace(sch, steps=steps)


@pytest.mark.parametrize(
    "case",
    [
        "nccl",
        "pairwise",
        "variopath",
        "nccl-zipf",
        "pairwise-pipelined",
        "nccl-pcie",
        "nccl-zipf-pcie",
        "pairwise-pcie",
        "paced-pcie",
        "paced-pcie-fair",
        "trigger-pcie",
        "trigger-pcie-fair",
    ],
)
def test_exact_simulation_matches_reference(bf3x2, case: str) -> None:
    """Without coalescing, the incremental simulator reproduces the plain one, contention
    included (its capacities recomputed from scratch at every event)."""
    network = legacy_model(2e-6, DEFAULT_LAMBDA_S)
    for suffix, model in (("-pcie-fair", PCIE_FAIR), ("-pcie", PCIE)):
        if case.endswith(suffix):
            case = case.removesuffix(suffix)
            network = model.replace(
                issue_s=2e-6, latency_pcie_s=0.0, latency_net_s=0.0, barrier_s=DEFAULT_LAMBDA_S
            )
            break
    name, _, variant = case.partition("-")
    if name == "paced":  # paced flows that fit their links: the rule decides their loss
        sch = paced(bf3x2, workloads.moe(16, 64, seed=1), DEFAULT_LAMBDA_S)
    elif name == "trigger":  # l20-cx7: its uplinks push writes toward three root complexes
        l20 = PathModel(preset("l20-cx7"))
        sch = paced(l20, workloads.moe(16, 64, seed=1), DEFAULT_LAMBDA_S)
        res = FluidSimulator(l20.topology, network, coalesce=0).run(sch)
        assert res.transfer_end == pytest.approx(
            reference_run(sch, l20.topology, network)[2], rel=1e-9
        )
        return
    elif variant == "zipf":
        demand = workloads.zipf(16, 0.8, 1 << 20, seed=2)
        sch = get_scheduler(name).plan(PlanRequest(demand, bf3x2, DEFAULT_LAMBDA_S))
    else:  # the reference knows no signals: variopath's plan for pcie-fair is one step
        sch = moe_schedule(bf3x2, name, network="pcie-fair" if name == "variopath" else None)
    if variant == "pipelined":
        sch = pipelined(sch)
    res = FluidSimulator(bf3x2.topology, network, coalesce=0).run(sch)
    start, step_end, transfer_end = reference_run(sch, bf3x2.topology, network)
    assert res.step_start == pytest.approx(start, rel=1e-9)
    assert res.step_end == pytest.approx(step_end, rel=1e-9)
    assert res.transfer_end == pytest.approx(transfer_end, rel=1e-9)


@pytest.mark.parametrize(
    ("nodes", "scheduler", "eps"),
    [
        (2, "nccl", DEFAULT_COALESCE),
        (2, "nccl", 1e-2),
        (2, "pairwise", 1e-2),
        (8, "nccl", DEFAULT_COALESCE),
    ],
)
@pytest.mark.parametrize("contention", ["none", "pcie"])
def test_coalescing_error_is_bounded(nodes: int, scheduler: str, eps: float, contention) -> None:
    """On MoE AlltoAllv, coalescing moves the completion time by at most ε and every transfer's
    end by at most 2ε (relative), with far fewer events on the all-concurrent schedule."""
    model = PathModel(preset("r5080-bf3", nodes))
    sch = moe_schedule(model, scheduler)
    exact = FluidSimulator(model.topology, contention, coalesce=0).run(sch)
    res = FluidSimulator(model.topology, contention, coalesce=eps).run(sch)
    assert abs(res.completion_s - exact.completion_s) <= eps * exact.completion_s
    assert np.all(np.abs(res.transfer_end - exact.transfer_end) <= 2 * eps * exact.transfer_end)
    if nodes == 8:  # 4,032 transfers at once: 3,007 events exact without contention, 800 with
        assert res.events * (5 if contention == "none" else 1.5) < exact.events


def test_coalesced_transfers_end_at_their_projected_time(fig1) -> None:
    """Two flows share the PXB uplink; the second has δ more bytes. Exact: it sends δ alone at
    64 GB/s. Coalesced: it retires with the first, at its own projected end δ / 32 GB/s later."""
    delta = 16_000  # δ / 32 GB/s = 0.5 µs, within ε = 10⁻³ of its 1 ms in flight
    sch = schedule(
        fig1, [[lane(fig1, 0, 3, "PXB", 32 * MB), lane(fig1, 1, 4, "PXB", 32 * MB + delta)]]
    )
    exact = FluidSimulator(fig1.topology, IDEAL, coalesce=0).run(sch)
    res = FluidSimulator(fig1.topology, IDEAL, coalesce=1e-3).run(sch)
    assert exact.transfer_end == pytest.approx([1e-3, 1e-3 + delta / 64e9], rel=1e-12)
    assert res.transfer_end == pytest.approx([1e-3, 1e-3 + delta / 32e9], rel=1e-12)
    assert (exact.events, res.events) == (2, 1)
    # a tighter tolerance keeps them apart, and the result exact
    res = FluidSimulator(fig1.topology, IDEAL, coalesce=1e-4).run(sch)
    assert res.transfer_end == pytest.approx(exact.transfer_end, rel=1e-12)


def test_negative_coalesce_is_refused(fig1) -> None:
    with pytest.raises(ScheduleError, match="coalesce"):
        FluidSimulator(fig1.topology, coalesce=-1e-3)
