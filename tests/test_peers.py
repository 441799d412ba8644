"""Peer schedulers (FAST, DeepEP, RailWave, MSCCL): valid schedules on the presets, the structure
each paper prescribes on small hand-computed cases, and simulated times."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from variopath_jax import workloads
from variopath_jax.baselines.fast import (
    balance_tile,
    birkhoff,
    pad_to_doubly_stochastic,
    unit_bytes,
)
from variopath_jax.baselines.nccl import nccl_route, rail_nics
from variopath_jax.baselines.railwave import rail_split
from variopath_jax.cli import main
from variopath_jax.schedule import Schedule, validate
from variopath_jax.schedulers import PlanRequest, get_scheduler, scheduler_names
from variopath_jax.sim import FluidSimulator
from variopath_jax.topology import PathModel, preset

PEERS = ["fast", "deepep", "deepep-rdma", "railwave", "msccl"]


def plan(name: str, model: PathModel, demand: np.ndarray) -> Schedule:
    return get_scheduler(name).plan(PlanRequest(demand, model, 5e-6))


def net_steps(sch: Schedule) -> list[int]:
    return [s for s, st in enumerate(sch.steps) if any(t.cls == "NET" for t in st.transfers)]


@pytest.mark.parametrize(
    "topo_name, nodes",
    [("fig1", 1), ("r5080-bf3", 1), ("r5080-bf3", 2), ("r5090-bf3", 2), ("l20-cx7", 2)],
)
def test_peers_valid(topo_name: str, nodes: int) -> None:
    topo = preset(topo_name, nodes)
    model = PathModel(topo)
    n = topo.num_ranks
    demands = (
        workloads.uniform(n, 1000),
        workloads.moe(n, 8, seed=2),
        workloads.zipf(n, 0.6, 1 << 14, seed=1),
    )
    for name in PEERS:
        for demand in demands:
            sch = plan(name, model, demand)
            v = validate(sch, demand, topo)
            assert v.ok, (name, v.errors)
            assert sch.meta["scheduler"] == name
    if topo_name == "r5080-bf3":  # simulate on the small presets only (speed)
        for name in PEERS:
            res = FluidSimulator(topo).run(plan(name, model, demands[1]))
            assert math.isfinite(res.completion_s) and res.completion_s > 0
            assert res.total_bytes == demands[1].sum()


def test_registry_and_empty_demand() -> None:
    assert set(PEERS) <= set(scheduler_names())
    model = PathModel(preset("r5080-bf3", 2))
    for name in PEERS:
        sch = plan(name, model, np.zeros((16, 16), dtype=np.int64))
        assert sch.steps == [] and validate(sch, np.zeros((16, 16)), model.topology).ok


def test_diagonal_ignored_and_deterministic() -> None:
    model = PathModel(preset("r5080-bf3", 2))
    demand = workloads.zipf(16, 0.8, 1 << 14, seed=3)
    with_self = demand + np.diag(np.arange(1, 17))
    for name in PEERS:
        a = plan(name, model, demand).to_dict()
        assert plan(name, model, with_self).to_dict() == a
        assert plan(name, model, demand.copy()).to_dict() == a


# ----- FAST -----------------------------------------------------------------------------------
def test_birkhoff_and_padding() -> None:
    stages = birkhoff(np.array([[0, 2, 1], [1, 0, 2], [2, 1, 0]]))
    assert [(w, p.tolist()) for w, p in stages] == [(2, [1, 2, 0]), (1, [2, 0, 1])]
    padded = pad_to_doubly_stochastic(np.array([[0, 3], [1, 0]]))
    assert padded.tolist() == [[0, 3], [3, 0]]  # the lighter row and column get the virtual 2
    skewed = np.array([[0, 5, 1], [0, 0, 2], [1, 0, 0]])
    padded = pad_to_doubly_stochastic(skewed)
    assert (padded >= skewed).all() and set(padded.sum(0)) == set(padded.sum(1)) == {6}
    total = sum(w * np.eye(3, dtype=np.int64)[p] for w, p in birkhoff(padded))
    assert (total == padded).all()
    # the scale unit keeps every line sum within FAST's 100 units
    server = np.array([[0, 1600, 800], [800, 0, 1600], [1600, 800, 0]])
    assert unit_bytes(server) == 25 and unit_bytes(server, 10_000) == 1


def test_fast_balance_tile_matches_the_paper_example() -> None:
    # FAST §4.1: B0 sends 8 units to server A, B1 4; B0 hands 2 to B1 so both carry 6
    pieces, load = balance_tile(np.array([[5, 3], [1, 3]]))
    assert load.tolist() == [6, 6]
    assert pieces[0] == [(0, 1, 1), (0, 0, 5)]  # carrier 0: bytes to redistribute first
    assert pieces[1] == [(1, 0, 1), (0, 1, 2), (1, 1, 3)]  # B0's 2 bytes for A1 land directly


def test_fast_two_nodes_one_stage_equal_shares() -> None:
    model = PathModel(preset("r5080-bf3", 2))
    demand = np.zeros((16, 16), dtype=np.int64)
    demand[0, 8:] = 1000  # GPU 0 alone sends 8000 bytes to node 1
    demand[9, 3] = 800  # node 1 -> node 0: 800 bytes, 100 per GPU after balancing
    demand[1, 2] = 50  # intra-node demand goes directly
    sch = plan("fast", model, demand)
    assert validate(sch, demand, model.topology).ok and sch.meta["stages"] == 1
    (stage,) = net_steps(sch)
    sent = {}
    for t in sch.steps[stage].transfers:
        assert t.dst == t.src + 8 or t.dst == t.src - 8  # same local index on the peer server
        sent[t.src] = sent.get(t.src, 0) + t.nbytes
    assert sent == {**{g: 1000 for g in range(8)}, **{g: 100 for g in range(8, 16)}}
    balance = [t for st in sch.steps for t in st.transfers if t.carries[0] != t.src]
    assert balance and all(t.cls != "NET" for t in sch.steps[0].transfers)
    direct = [t for st in sch.steps for t in st.transfers if t.carries == (1, 2)]
    assert [(t.src, t.dst, t.nbytes) for t in direct] == [(1, 2, 50)]
    # the redistribution overlaps nothing here but follows the stage
    last = sch.steps[-1]
    assert stage in sch.dependencies(len(sch.steps) - 1)
    assert all(t.cls != "NET" for t in last.transfers)


def test_fast_three_nodes_birkhoff_stages() -> None:
    model = PathModel(preset("r5080-bf3", 3))
    server = np.array([[0, 2, 1], [1, 0, 2], [2, 1, 0]])
    demand = np.kron(server * 100, np.ones((8, 8), dtype=np.int64))  # 800 B/GPU per unit
    sch = plan("fast", model, demand)
    assert validate(sch, demand, model.topology).ok
    stages = net_steps(sch)
    assert len(stages) == sch.meta["stages"] == 2
    for s, (weight, shift) in zip(stages, [(1600, 1), (800, 2)], strict=True):
        per_gpu = {}
        for t in sch.steps[s].transfers:
            assert t.dst // 8 == (t.src // 8 + shift) % 3 and t.dst % 8 == t.src % 8
            per_gpu[t.src] = per_gpu.get(t.src, 0) + t.nbytes
        assert set(per_gpu.values()) == {weight} and len(per_gpu) == 24
    # stage 2's scale-out depends on stage 1's only, so it overlaps redistribution 1
    assert sch.dependencies(stages[1]) == (stages[0],)


def test_fast_single_node_is_direct() -> None:
    model = PathModel(preset("r5080-bf3", 1))
    demand = workloads.zipf(8, 0.6, 1 << 14, seed=0)
    sch = plan("fast", model, demand)
    assert len(sch.steps) == 1
    assert all((t.src, t.dst) == t.carries for t in sch.steps[0].transfers)


# ----- DeepEP ---------------------------------------------------------------------------------
def test_deepep_two_hops_via_same_index_gpu() -> None:
    model = PathModel(preset("r5080-bf3", 2))
    nics = rail_nics(model)
    demand = np.zeros((16, 16), dtype=np.int64)
    demand[0, 11] = 1000  # node 0 local 0 -> node 1 local 3: RDMA to rank 8, then to 11
    demand[0, 8] = 400  # same index: one hop
    demand[0, 5] = 300  # intra-node: direct
    sch = plan("deepep", model, demand)
    assert validate(sch, demand, model.topology).ok
    hops = {}
    for s, st in enumerate(sch.steps):
        for t in st.transfers:
            hops.setdefault(t.carries, []).append((s, t.src, t.dst, t.nbytes, t.cls))
    far = hops[(0, 11)]
    rdma = [h for h in far if h[1] == 0]
    fwd = [h for h in far if h[1] == 8]
    assert [h[2:] for h in rdma] == [(8, 250, "NET")] * 4
    assert [h[2:4] for h in fwd] == [(11, 250)] * 4
    assert all(h[4] == nccl_route(model, 8, 11, nics).cls for h in fwd)
    for (s_net, *_), (s_fwd, *_) in zip(rdma, fwd, strict=True):
        assert s_net in sch.dependencies(s_fwd)  # chunk c forwards after its RDMA
    assert [h[1:4] for h in hops[(0, 8)]] == [(0, 8, 100)] * 4
    assert [h[1:4] for h in hops[(0, 5)]] == [(0, 5, 300)]


def test_deepep_rdma_everything_through_nics() -> None:
    model = PathModel(preset("r5080-bf3", 2))
    demand = workloads.uniform(16, 100)
    sch = plan("deepep-rdma", model, demand)
    assert len(sch.steps) == 1 and sch.num_transfers == 240
    by_pair = {t.carries: t for t in sch.steps[0].transfers}
    assert by_pair[(0, 1)].cls == "NIC"  # a loopback through their shared NIC
    names = [model.graph.link_name(lid) for lid in by_pair[(0, 1)].path]
    assert "n0/nic0->net" in names and "net->n0/nic0" in names
    assert by_pair[(0, 2)].cls == "NIC" and by_pair[(0, 9)].cls == "NET"
    assert all(t.cls in ("NIC", "NET") for t in sch.steps[0].transfers)


# ----- RailWave -------------------------------------------------------------------------------
def test_rail_split_is_even() -> None:
    rail_of = [0, 0, 1, 1, 2, 2, 3, 3]
    out = rail_split(np.array([1003, 0, 0, 0, 0, 0, 0, 0]), rail_of, [0, 1, 2, 3], 1)
    per_rail = {r: sum(x for q, _, x in out if q == r) for r in range(4)}
    assert per_rail == {0: 250, 1: 251, 2: 251, 3: 251}  # remainders start at rail 1
    out = rail_split(np.array([0, 0, 400, 0, 0, 0, 0, 400]), rail_of, [0, 1, 2, 3], 0)
    assert (1, 2, 200) in out and (3, 7, 200) in out  # own-rail bytes stay on their rail


def test_railwave_spreads_a_node_pair_over_rails() -> None:
    model = PathModel(preset("r5080-bf3", 2))
    nics = rail_nics(model)
    demand = np.zeros((16, 16), dtype=np.int64)
    demand[0, 8] = 4000  # one GPU, one destination: node 0 -> 1 split evenly over 4 rails
    sch = plan("railwave", model, demand)
    assert validate(sch, demand, model.topology).ok
    per_nic = {}
    for s in net_steps(sch):
        for t in sch.steps[s].transfers:
            per_nic[nics[t.src]] = per_nic.get(nics[t.src], 0) + t.nbytes
            assert nics[t.dst] == nics[t.src] + 4  # fixed egress-ingress rail correspondence
    assert per_nic == {0: 1000, 1: 1000, 2: 1000, 3: 1000}


def test_railwave_waves_are_cyclic_shifts() -> None:
    model = PathModel(preset("r5080-bf3", 3))
    demand = workloads.uniform(24, 100)
    sch = plan("railwave", model, demand)
    assert validate(sch, demand, model.topology).ok
    stages = net_steps(sch)
    assert len(stages) == 2
    for k, s in enumerate(stages, start=1):
        assert {(t.src // 8, t.dst // 8) for t in sch.steps[s].transfers} == {
            (n, (n + k) % 3) for n in range(3)
        }


# ----- MSCCL ----------------------------------------------------------------------------------
def test_msccl_pairwise_stages_on_nccl_routes() -> None:
    model = PathModel(preset("r5080-bf3", 2))
    nics = rail_nics(model)
    demand = workloads.uniform(16, 1000)
    sch = plan("msccl", model, demand)
    assert len(sch.steps) == 15 and sch.num_transfers == 240
    for k, step in enumerate(sch.steps, start=1):
        assert sch.dependencies(k - 1) == ((k - 2,) if k > 1 else ())
        for t in step.transfers:
            assert t.dst == (t.src + k) % 16
            assert t.path == model.path(t.src, t.dst, nccl_route(model, t.src, t.dst, nics)).links


# ----- simulated, through the CLI -------------------------------------------------------------
@pytest.mark.parametrize("name", PEERS)
def test_cli_run(capsys, name: str) -> None:
    argv = ["run", "--topology", "r5080-bf3", "--nodes", "2", "--scheduler", name]
    assert main([*argv, "--workload", "moe", "--tokens", "16", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["valid"] and out["scheduler"] == name
    assert math.isfinite(out["completion_s"]) and out["algbw_gbps"] > 0
