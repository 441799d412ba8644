"""The ``op`` scheduler (what the JAX op runs in steady state, its planning on the call path),
``variopath run --scheduler op [--previous FILE]`` and ``benchmarks/bench_op_call.py``."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

from variopath_jax import workloads
from variopath_jax.cli import main
from variopath_jax.runner import plans_on_call_path, run_one
from variopath_jax.schedule import validate
from variopath_jax.topology import PathModel, preset

FAST = {"repeats": 3, "flush_bytes": 1 << 20}  # planning timed briefly: these tests check plans


def run_json(capsys, *argv: str) -> dict:
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_op_counts_its_planning() -> None:
    assert plans_on_call_path("op") and not plans_on_call_path("nccl")


def test_op_decides_under_its_default_models_unless_told() -> None:
    model = PathModel(preset("r5080-bf3", 1))
    demand = workloads.moe(8, 16, seed=0)
    # judged under `none`, decided under the op's defaults: the unprofiled models
    res = run_one(model, "op", demand, network="none", options=FAST)
    meta = res.schedule.meta
    assert res.validation.ok and res.sim.network == "none"
    assert meta["networks"] == ["pcie", "pcie-fair"] and meta["scheduler"] == "op"
    assert meta["decided_from"] == "same demand" and meta["plan"] == meta["decision"]
    assert 0 < meta["plan_s_min"] <= res.plan_s == meta["plan_s"]
    told = run_one(model, "op", demand, network="pcie", plan_for="none", options=FAST)
    assert told.schedule.meta["networks"] == ["none"]


def test_op_applies_a_decision_from_another_demand() -> None:
    model = PathModel(preset("r5080-bf3", 2))
    demand, previous = workloads.moe(16, 128, seed=0), workloads.moe(16, 1024, seed=3)
    res = run_one(model, "op", demand, options=FAST | {"previous": previous})
    assert res.validation.ok and res.schedule.meta["decided_from"] == "previous demand"
    assert validate(res.schedule, demand, model.topology).ok
    same = run_one(model, "op", demand, options=FAST | {"previous": demand.copy()})
    assert same.schedule.meta["decided_from"] == "same demand"


def test_run_op_contract(capsys, tmp_path) -> None:
    argv = ("run", "--topology", "r5080-bf3", "--scheduler", "op", "--workload", "moe")
    out = run_json(capsys, *argv, "--tokens", "16")
    assert out["scheduler"] == "op" and out["valid"] and out["plan_s"] > 0
    assert out["completion_s"] > 0 and out["decided_from"] == "same demand"
    assert out["planned_for"] == ["pcie", "pcie-fair"] and out["plan_choice"] == out["decision"]
    previous = tmp_path / "previous.npy"
    np.save(previous, workloads.zipf(8, 0.6, 64 << 20, seed=1))
    again = run_json(
        capsys, *argv, "--tokens", "16", "--contention", "pcie-fair", "--previous", str(previous)
    )
    assert again["valid"] and again["plan_s"] > 0 and again["contention"] == "pcie-fair"
    assert again["decided_from"] == "previous demand" and again["previous"] == str(previous)
    assert again["total_bytes"] == out["total_bytes"]  # the plan serves this call's demand


def test_run_refuses_a_bad_previous(capsys, tmp_path) -> None:
    argv = ["run", "--topology", "r5080-bf3", "--workload", "moe", "--tokens", "16"]
    small = tmp_path / "small.csv"
    small.write_text("0,1\n1,0\n")
    assert main([*argv, "--scheduler", "op", "--previous", str(small)]) == 2
    err = capsys.readouterr().err
    assert "--previous" in err and "topology has 8 ranks" in err
    assert main([*argv, "--scheduler", "op", "--previous", str(tmp_path / "none.npy")]) == 2
    assert "--previous" in capsys.readouterr().err
    good = tmp_path / "good.npy"
    np.save(good, workloads.moe(8, 16, seed=1))
    assert main([*argv, "--scheduler", "nccl", "--previous", str(good)]) == 2
    assert "needs --scheduler op" in capsys.readouterr().err


def _bench():
    path = Path(__file__).parents[1] / "benchmarks" / "bench_op_call.py"
    spec = importlib.util.spec_from_file_location("bench_op_call", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up
    spec.loader.exec_module(module)
    return module


def test_bench_op_call_row() -> None:
    bench = _bench()
    assert "nccl" in bench.PEERS and len(bench.points()) == 49
    rows = bench.measure(bench.Point("r5080-bf3", 1, "moe", 16), **FAST)
    assert [r["model"] for r in rows] == ["pcie", "pcie-fair", "none"]
    for r in rows:
        assert set(r) == set(bench.COLUMNS)
        assert r["op_valid"] and r["ranks"] == 8 and r["op_plan_s"] > 0
        assert r["op_total_s"] == pytest.approx(r["op_plan_s"] + r["op_comm_s"])
        assert r["best_peer_s"] <= r["nccl_s"] and r["best_peer_over_op"] <= r["nccl_over_op"]
        assert r["nccl_over_op"] == pytest.approx(r["nccl_s"] / r["op_total_s"])
        # the LP bound is below any plan; planning only adds to the op's time
        assert 0 < r["bound_s"] <= r["op_comm_s"] * (1 + 1e-6) and r["bound_over_op"] < 1
        assert r["op_over_ceiling"] > r["op_comm_over_ceiling"] > 0.5
        assert r["plan_over_comm"] == pytest.approx(r["op_plan_s"] / r["op_comm_s"])
    summary = bench.summarize(rows)
    assert [s["model"] for s in summary] == ["pcie", "pcie-fair", "none"]
    for s, r in zip(summary, rows, strict=True):
        assert s["points"] == 1 and not math.isnan(s["nccl_over_op"])
        assert s["max_plan_over_comm_8_64"] == pytest.approx(r["plan_over_comm"])
        assert s["plan_over_comm_256"] is None and s["plan_s_r5080_bf3_x2_moe128"] is None
    assert len(bench.summary_lines(summary)) >= 3
