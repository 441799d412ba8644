"""The schedule IR: validation (relays, channels, corruption) and serialisation."""

from __future__ import annotations

import copy
import dataclasses
import json
import pickle

import numpy as np
import pytest
from helpers import lane, schedule

from variopath_jax.schedule import LazySteps, Schedule, ScheduleError, Step, validate
from variopath_jax.topology import PathModel, preset

MB = 10**6


@pytest.fixture(scope="module")
def fig1() -> PathModel:
    return PathModel(preset("fig1"))


def demand(entries: dict[tuple[int, int], int], n: int = 6) -> np.ndarray:
    d = np.zeros((n, n), dtype=np.int64)
    for k, v in entries.items():
        d[k] = v
    return d


def errors(sch: Schedule, d: np.ndarray, model: PathModel) -> str:
    v = validate(sch, d, model.topology)
    assert not v.ok
    return " | ".join(v.errors)


def test_direct_schedule_is_valid(fig1) -> None:
    sch = schedule(
        fig1,
        [[lane(fig1, 0, 3, "PXB", 5)], [lane(fig1, 0, 3, "NIC", 7), lane(fig1, 3, 0, "PXB", 2)]],
    )
    assert validate(sch, demand({(0, 3): 12, (3, 0): 2}), fig1.topology).ok


def test_relay_through_an_intermediate_gpu(fig1) -> None:
    d = demand({(0, 4): 10})
    hop1 = lane(fig1, 0, 3, "PXB", 10, carries=(0, 4))
    hop2 = lane(fig1, 3, 4, "PIX", 10, carries=(0, 4))
    assert validate(schedule(fig1, [[hop1], [hop2]]), d, fig1.topology).ok
    # forwarding in the same step as the arrival: the bytes are not surely there
    assert "surely arrived" in errors(schedule(fig1, [[hop1, hop2]]), d, fig1)
    # forwarding in a step that may run concurrently (no dependency on the arrival)
    assert "surely arrived" in errors(schedule(fig1, [[hop1], [hop2]], deps=[(), ()]), d, fig1)
    # forwarding more than arrived
    short = dataclasses.replace(hop1, nbytes=6)
    msg = errors(schedule(fig1, [[short, lane(fig1, 0, 4, "PXB", 4)], [hop2]]), d, fig1)
    assert "receives 6 bytes but forwards 10" in msg
    # bytes left at the relay
    assert "end at rank 3" in errors(schedule(fig1, [[hop1]]), d, fig1)


def test_missing_extra_and_self_bytes(fig1) -> None:
    sch = schedule(fig1, [[lane(fig1, 0, 3, "PXB", 5)]])
    assert "D[0][3] = 6 bytes but 5 leave rank 0" in errors(sch, demand({(0, 3): 6}), fig1)
    assert "D[1][2] = 3 bytes but 0 leave" in errors(sch, demand({(0, 3): 5, (1, 2): 3}), fig1)
    assert "self traffic" in errors(sch, demand({(0, 3): 5, (2, 2): 1}), fig1)


def test_corrupted_transfers(fig1) -> None:
    good = lane(fig1, 0, 3, "PXB", 5)
    d = demand({(0, 3): 5})
    broken = dataclasses.replace(good, path=good.path[:1] + good.path[2:])
    assert "not a route" in errors(schedule(fig1, [[broken]]), d, fig1)
    assert "exceeds the path" in errors(
        schedule(fig1, [[dataclasses.replace(good, rate=100.0)]]), d, fig1
    )
    assert "unknown link id" in errors(
        schedule(fig1, [[dataclasses.replace(good, path=(10**6,))]]), d, fig1
    )
    assert "bytes must be > 0" in errors(
        schedule(fig1, [[dataclasses.replace(good, nbytes=0)]]), d, fig1
    )
    bad_dep = Schedule(6, [Step((good,), (3,))], fig1.topology.fingerprint, 0.0)
    assert "not an earlier step" in errors(bad_dep, d, fig1)
    other = dataclasses.replace(schedule(fig1, [[good]]), fingerprint="0" * 16)
    assert "is for topology" in errors(other, d, fig1)


def test_channel_rules(fig1) -> None:
    # two lanes over the same PXB resources
    shared = schedule(
        fig1, [[lane(fig1, 0, 3, "PXB", 1), lane(fig1, 1, 4, "PXB", 1)]], kind="channel"
    )
    assert "share resource n0/sw0->n0/sw" in errors(shared, shared.served(), fig1)
    twice = schedule(
        fig1, [[lane(fig1, 0, 3, "PXB", 1), lane(fig1, 0, 1, "PIX", 1)]], kind="channel"
    )
    assert "sends twice" in errors(twice, twice.served(), fig1)
    relay = schedule(
        fig1,
        [
            [lane(fig1, 0, 3, "PXB", 1, carries=(0, 4))],
            [lane(fig1, 3, 4, "PIX", 1, carries=(0, 4))],
        ],
        kind="channel",
    )
    assert "must be direct" in errors(relay, demand({(0, 4): 1}), fig1)
    # the same shared lanes are fine in a general schedule: the simulator shares them fairly
    assert validate(dataclasses.replace(shared, kind="general"), shared.served(), fig1.topology).ok


def test_json_round_trip(fig1, tmp_path) -> None:
    sch = schedule(
        fig1,
        [[lane(fig1, 0, 3, "PXB", 5)], [lane(fig1, 2, 5, "NIC", 9)]],
        deps=[None, ()],
        kind="channel",
    )
    sch.meta["scheduler"] = "test"
    path = tmp_path / "s.json"
    sch.save(path)
    again = Schedule.load(path)
    assert again == sch
    data = json.loads(path.read_text())
    data["steps"][0]["transfers"][0][2] = 5.5
    path.write_text(json.dumps(data))
    with pytest.raises(ScheduleError, match="must be integers"):
        Schedule.load(path)
    path.write_text("{nope")
    with pytest.raises(ScheduleError, match="invalid JSON"):
        Schedule.load(path)
    with pytest.raises(ScheduleError, match="not a variopath-schedule"):
        Schedule.from_dict({"format": "other"})


def test_lazy_steps_build_each_step_once_when_read(fig1) -> None:
    eager = schedule(
        fig1,
        [[lane(fig1, 0, 3, "PXB", 5)], [lane(fig1, 2, 5, "NIC", 9)], [lane(fig1, 3, 0, "PXB", 2)]],
    )
    built = []

    def build(k: int) -> Step:
        built.append(k)
        return eager.steps[k]

    steps = LazySteps(3, build)
    lazy = dataclasses.replace(eager, steps=steps)
    assert len(steps) == 3 and built == []  # nothing built until read
    assert steps[-1] == eager.steps[2] and built == [2]
    assert steps[0:2] == eager.steps[0:2] and built == [2, 0, 1]
    assert list(steps) == eager.steps and built == [2, 0, 1]  # each built once
    assert steps == eager.steps and eager.steps == steps  # compares as its list, both ways
    assert steps != eager.steps[:2] and steps != "abc"
    assert lazy == eager and lazy.to_dict() == eager.to_dict()
    assert pickle.loads(pickle.dumps(lazy)) == eager and copy.deepcopy(lazy) == eager
    assert lazy.num_transfers == 3 and validate(lazy, lazy.served(), fig1.topology).ok
    with pytest.raises(IndexError, match="step 3 of a schedule of 3 steps"):
        steps[3]


def test_served_and_modeled_time(fig1) -> None:
    sch = schedule(
        fig1, [[lane(fig1, 0, 3, "PXB", 64 * MB), lane(fig1, 2, 5, "NIC", 25 * MB)]], lam=1e-5
    )
    assert sch.served()[0, 3] == 64 * MB and sch.served().sum() == 89 * MB
    assert sch.modeled_time() == pytest.approx(1e-5 + 1e-3)
    assert sch.modeled_time(2e-6) == pytest.approx(1e-5 + 2e-6 + 1e-3)


def test_reversed_schedule_serves_the_transposed_demand() -> None:
    """A plan reversed (as the op runs a cached plan for the transposed demand) is a valid plan
    of the transposed demand: every transfer j -> i along the reversed path of its i -> j."""
    from variopath_jax import workloads
    from variopath_jax.schedule import reversed_schedule
    from variopath_jax.schedulers import PlanRequest, get_scheduler

    topo = preset("r5080-bf3", 2)
    demand = workloads.moe(topo.num_ranks, 32, seed=2)
    plan = get_scheduler("variopath-paper").plan(PlanRequest(demand, PathModel(topo), 20e-6))
    back = reversed_schedule(plan, topo.graph)
    assert validate(back, demand.T.copy(), topo).ok
    assert [len(s.transfers) for s in back.steps] == [len(s.transfers) for s in plan.steps]
    there, home = plan.steps[0].transfers[0], back.steps[0].transfers[0]
    assert (home.src, home.dst, home.nbytes) == (there.dst, there.src, there.nbytes)


def test_json_v3_round_trips_pull(fig1, tmp_path) -> None:
    pulled = dataclasses.replace(lane(fig1, 0, 3, "PXB", 5), pull=True)
    sch = schedule(fig1, [[pulled, lane(fig1, 3, 0, "PXB", 2)]])
    data = sch.to_dict()
    assert data["version"] == 3
    assert [row[10] for row in data["steps"][0]["transfers"]] == [True, False]
    path = tmp_path / "s.json"
    sch.save(path)
    again = Schedule.load(path)
    assert again == sch
    assert [t.pull for t in again.steps[0].transfers] == [True, False]
    # a pull must be a boolean, and a version-3 row has all 11 fields
    bad = copy.deepcopy(data)
    bad["steps"][0]["transfers"][0][10] = 1
    with pytest.raises(ScheduleError, match="staged and pull must be true or false"):
        Schedule.from_dict(bad)
    bad = copy.deepcopy(data)
    del bad["steps"][0]["transfers"][0][10]
    with pytest.raises(ScheduleError, match="expected 11 fields, got 10"):
        Schedule.from_dict(bad)


@pytest.mark.parametrize("version, width", [(2, 10), (1, 8)])
def test_older_json_versions_load_as_pushes(fig1, version: int, width: int) -> None:
    """Files written before ``pull`` existed (versions 1 and 2) mean pushes, as then."""
    staged = dataclasses.replace(lane(fig1, 0, 3, "PXB", 5), staged=version > 1)
    sch = schedule(fig1, [[staged, lane(fig1, 3, 0, "PXB", 2)]])
    data = sch.to_dict()
    data["version"] = version
    for step in data["steps"]:
        step["transfers"] = [row[:width] for row in step["transfers"]]
    again = Schedule.from_dict(json.loads(json.dumps(data)))
    assert again == sch
    assert not any(t.pull for st in again.steps for t in st.transfers)
    data["steps"][0]["transfers"][0].append(True)  # a pull field in an older file is an error
    with pytest.raises(ScheduleError, match=f"expected {width} fields"):
        Schedule.from_dict(data)
    data["version"] = 4
    with pytest.raises(ScheduleError, match="unsupported version 4"):
        Schedule.from_dict(data)
