"""The paper's worked examples (Figures 1 and 2) in the simulator."""

from __future__ import annotations

import pytest
from helpers import lane, schedule

from variopath_jax.schedule import validate
from variopath_jax.sim import FluidSimulator, legacy_model
from variopath_jax.topology import PathModel, preset

MB = 10**6
IDEAL = legacy_model(0.0, 0.0)  # the paper's model: perfect sharing, no per-message cost


@pytest.fixture(scope="module")
def fig1() -> PathModel:
    return PathModel(preset("fig1"))


def aggregate(model: PathModel, stage: list[tuple[int, int, str]]) -> float:
    """Aggregate modeled bandwidth (GB/s) of one stage: the sum of the max-min fair rates."""
    sch = schedule(model, [[lane(model, i, j, cls, 64 * MB) for i, j, cls in stage]])
    assert validate(sch, sch.served(), model.topology).ok
    result = FluidSimulator(model.topology, IDEAL).run(sch)
    return result.throughput[0][2]


def test_figure1_stage_a_fastest_path(fig1) -> None:
    # cyclic k=3: every flow crosses the switches on its fastest path (PXB), three per direction
    stage = [(i, (i + 3) % 6, "PXB") for i in range(6)]
    assert aggregate(fig1, stage) == pytest.approx(128.0)


def test_figure1_stage_b_path_only(fig1) -> None:
    # the same peers; one flow per direction moved to the NIC path, two still share the PXB link
    stage = [
        (0, 3, "PXB"),
        (1, 4, "PXB"),
        (2, 5, "NIC"),
        (3, 0, "PXB"),
        (4, 1, "PXB"),
        (5, 2, "NIC"),
    ]
    assert aggregate(fig1, stage) == pytest.approx(228.0)


def test_figure1_stage_c_joint_peer_path(fig1) -> None:
    # peers and paths chosen together: PIX, PXB and NIC per switch, nothing shared
    stage = [
        (0, 1, "PIX"),
        (1, 4, "PXB"),
        (2, 5, "NIC"),
        (3, 0, "PXB"),
        (4, 3, "PIX"),
        (5, 2, "NIC"),
    ]
    assert aggregate(fig1, stage) == pytest.approx(356.0)
    sch = schedule(fig1, [[lane(fig1, i, j, c, MB) for i, j, c in stage]], kind="channel")
    assert validate(sch, sch.served(), fig1.topology).ok  # a feasible channel


def test_figure2_whole_flow_vs_chunks(fig1) -> None:
    """Flows A (114 MB), B (64 MB), C (50 MB) over a 64 GB/s PXB path and a 50 GB/s NIC path."""
    sim = FluidSimulator(fig1.topology, IDEAL)
    # (b) whole-flow binding: A on PXB; B then C serialise on the NIC path
    whole = schedule(
        fig1,
        [
            [lane(fig1, 0, 3, "PXB", 114 * MB)],
            [lane(fig1, 1, 4, "NIC", 64 * MB)],
            [lane(fig1, 2, 5, "NIC", 50 * MB)],
        ],
        deps=[(), (), (1,)],
    )
    assert sim.run(whole).completion_s == pytest.approx(
        (64 + 50) * MB / 50e9
    )  # 2.28 ms: the NIC tail
    # (c) chunk-level: A is split, its second chunk remapped to the NIC in stage 2
    chunked = schedule(
        fig1,
        [
            [lane(fig1, 0, 3, "PXB", 64 * MB), lane(fig1, 2, 5, "NIC", 50 * MB)],
            [lane(fig1, 1, 4, "PXB", 64 * MB), lane(fig1, 0, 3, "NIC", 50 * MB)],
        ],
        kind="channel",
    )
    assert validate(chunked, whole.served(), fig1.topology).ok
    assert sim.run(chunked).completion_s == pytest.approx(
        2 * 1e-3
    )  # two 1 ms stages: 0.28 ms saved
