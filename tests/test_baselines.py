"""NCCL and pairwise baselines: valid schedules, the paths NCCL's rules give, stage structure."""

from __future__ import annotations

import numpy as np
import pytest

from variopath_jax import workloads
from variopath_jax.baselines.nccl import nccl_route, rail_nics
from variopath_jax.errors import VarioPathError
from variopath_jax.schedule import validate
from variopath_jax.schedulers import PlanRequest, get_scheduler, scheduler_names
from variopath_jax.sim import FluidSimulator
from variopath_jax.topology import PathModel, Topology, preset


@pytest.mark.parametrize("name", ["nccl", "pairwise"])
@pytest.mark.parametrize(
    "topo_name, nodes", [("fig1", 1), ("r5080-bf3", 2), ("r5090-bf3", 2), ("direct-8", 2)]
)
def test_baselines_valid(name: str, topo_name: str, nodes: int) -> None:
    topo = preset(topo_name, nodes)
    model = PathModel(topo)
    for demand in (
        workloads.moe(topo.num_ranks, 16, seed=2),
        workloads.zipf(topo.num_ranks, 0.6, 1 << 16, seed=1),
    ):
        sch = get_scheduler(name).plan(PlanRequest(demand, model, 1e-5))
        v = validate(sch, demand, topo)
        assert v.ok, v.errors
        assert FluidSimulator(topo).run(sch).completion_s > 0


def test_registry() -> None:
    assert {"nccl", "pairwise"} <= set(scheduler_names())
    with pytest.raises(VarioPathError, match="unknown scheduler 'nope'"):
        get_scheduler("nope")


def test_nccl_paths_follow_its_rules() -> None:
    model = PathModel(preset("r5080-bf3", 2))
    nics = rail_nics(model)
    assert nics[:8] == [0, 0, 1, 1, 2, 2, 3, 3] and nics[8:10] == [4, 4]
    assert nccl_route(model, 0, 1, nics).cls == "PIX"
    assert nccl_route(model, 0, 2, nics).cls == "PXB"  # P2P inside the upper switch
    assert nccl_route(model, 0, 4, nics).cls == "SHM"  # SYS > PXB: host memory
    net = nccl_route(model, 0, 9, nics)
    assert net.cls == "NET" and net.nics == (0, 4)
    # l20-cx7: cross-switch pairs are PHB, so NCCL goes through host memory
    l20 = PathModel(preset("l20-cx7"))
    assert nccl_route(l20, 0, 4, rail_nics(l20)).cls == "SHM"
    # direct-8: NICs sit on root ports (PHB to the GPUs), so GPUDirect RDMA is off: staged via memory
    direct = PathModel(preset("direct-8", 2))
    staged = nccl_route(direct, 0, 8, rail_nics(direct))
    names = [direct.graph.link_name(lid) for lid in staged.links]
    assert names[:2] == ["n0/cpu0->n0/nic0", "n0/nic0->net"] or "n0/cpu0->n0/nic0" in names


def test_nccl_without_p2p_uses_host_memory() -> None:
    base = preset("fig1")
    model = PathModel(Topology(base.node, p2p=False))
    assert nccl_route(model, 0, 1, rail_nics(model)).cls == "SHM"


def test_nccl_is_one_concurrent_step() -> None:
    model = PathModel(preset("r5080-bf3", 2))
    d = workloads.uniform(16, 1000)
    sch = get_scheduler("nccl").plan(PlanRequest(d, model, 1e-5))
    assert len(sch.steps) == 1 and sch.num_transfers == 240


def test_pairwise_stages_are_cyclic_shifts() -> None:
    model = PathModel(preset("r5080-bf3", 2))
    d = workloads.uniform(16, 1000)
    d[0, 5] = 0  # sparse entries are simply left out
    sch = get_scheduler("pairwise").plan(PlanRequest(d, model, 1e-5))
    assert len(sch.steps) == 15
    for k, step in enumerate(sch.steps, start=1):
        assert all(t.dst == (t.src + k) % 16 for t in step.transfers)
        srcs = [t.src for t in step.transfers]
        assert len(set(srcs)) == len(srcs)
    assert sch.num_transfers == 239
    assert np.array_equal(sch.served(), d)
