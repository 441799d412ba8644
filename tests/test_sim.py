"""The fluid simulator against hand-computed cases."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from helpers import lane, schedule

from variopath_jax.schedule import Schedule, ScheduleError
from variopath_jax.sim import FluidSimulator, max_min_rates
from variopath_jax.topology import PathModel, preset

MB = 10**6


@pytest.fixture(scope="module")
def fig1() -> PathModel:
    return PathModel(preset("fig1"))


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


def test_shared_link_then_release(fig1) -> None:
    # 0->3 and 1->4 share the PXB links: 32 GB/s each until the smaller finishes
    sch = schedule(fig1, [[lane(fig1, 0, 3, "PXB", 32 * MB), lane(fig1, 1, 4, "PXB", 64 * MB)]])
    res = FluidSimulator(fig1.topology, alpha_s=0).run(sch)
    assert res.transfer_end == pytest.approx(
        [1e-3, 1.5e-3]
    )  # 32 MB at 32 GB/s; then 32 MB at 64 GB/s
    assert [round(r, 6) for _, _, r in res.throughput] == [64.0, 64.0]


def test_fair_share_respects_path_caps(fig1) -> None:
    slow = dataclasses.replace(lane(fig1, 0, 3, "PXB", 10 * MB), rate=10.0)
    sch = schedule(
        fig1, [[slow, lane(fig1, 1, 4, "PXB", 27 * MB), lane(fig1, 2, 5, "PXB", 27 * MB)]]
    )
    res = FluidSimulator(fig1.topology, alpha_s=0).run(sch)
    assert res.throughput[0][2] == pytest.approx(64.0)
    assert res.transfer_end == pytest.approx(
        [1e-3, 1e-3, 1e-3]
    )  # 10 + 27 + 27 share the 64 GB/s link


def test_endpoint_links_are_shared_too(fig1) -> None:
    # two flows into GPU 3 (PIX from 4 and PXB from 0) share the sw1->gpu3 endpoint link
    sch = schedule(fig1, [[lane(fig1, 4, 3, "PIX", 32 * MB), lane(fig1, 0, 3, "PXB", 32 * MB)]])
    res = FluidSimulator(fig1.topology, alpha_s=0).run(sch)
    assert res.completion_s == pytest.approx(1e-3)


def test_dependencies_lambda_and_alpha(fig1) -> None:
    a = lane(fig1, 0, 3, "PXB", 64 * MB)  # 1 ms alone
    b = lane(fig1, 2, 5, "NIC", 50 * MB)  # 1 ms alone
    c = lane(fig1, 4, 1, "PXB", 64 * MB)
    lam, alpha = 5e-6, 2e-6
    sim = FluidSimulator(fig1.topology, alpha_s=alpha)
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


def test_contention_free_schedule_runs_at_modeled_time() -> None:
    """Steps whose lanes share no link simulate to exactly Σ (λ + α + slowest lane)."""
    model = PathModel(preset("r5080-bf3", 2))
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
    res = FluidSimulator(model.topology, alpha_s=3e-6).run(sch)
    assert res.completion_s == pytest.approx(sch.modeled_time(3e-6), rel=1e-12)


def test_empty_schedule_and_algbw(fig1) -> None:
    empty = Schedule(6, [], fig1.topology.fingerprint, 1e-5)
    res = FluidSimulator(fig1.topology).run(empty)
    assert res.completion_s == 0 and res.algbw_gbps == 0
    sch = schedule(fig1, [[lane(fig1, 0, 1, "PIX", 64 * MB)]])
    res = FluidSimulator(fig1.topology, alpha_s=0).run(sch)
    assert res.algbw_gbps == pytest.approx(64 * MB / (6 * 1e-3) / 1e9)


def test_link_recording(fig1) -> None:
    sch = schedule(fig1, [[lane(fig1, 0, 3, "PXB", 32 * MB), lane(fig1, 1, 4, "PXB", 64 * MB)]])
    res = FluidSimulator(fig1.topology, alpha_s=0, record_links=True).run(sch)
    intervals, loads = res.link_load
    uplink = fig1.graph.link(fig1.graph.index["n0/sw0"], fig1.graph.index["n0/sw"])
    assert intervals.shape == (2, 2) and loads[:, uplink] == pytest.approx([64.0, 64.0])


def test_wrong_topology_is_refused(fig1) -> None:
    sch = schedule(fig1, [[lane(fig1, 0, 1, "PIX", MB)]])
    with pytest.raises(ScheduleError, match="topology"):
        FluidSimulator(preset("fig1", 2)).run(sch)
