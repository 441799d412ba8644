"""The `variopath` command line: JSON contracts and errors."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from variopath_jax.cli import main
from variopath_jax.topology import preset, spec


def run_json(capsys, *argv: str) -> dict:
    assert main([*argv, "--json"]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1  # exactly one JSON document
    return json.loads(out)


def test_topo_show_contract(capsys) -> None:
    out = run_json(capsys, "topo", "show", "r5080-bf3", "--nodes", "2")
    for key in (
        "fingerprint",
        "nodes",
        "gpus",
        "nics",
        "switches",
        "groups",
        "relations",
        "nic_relations",
        "paths",
    ):
        assert key in out
    assert out["fingerprint"] == preset("r5080-bf3", 2).fingerprint
    assert out["nodes"] == 2 and out["gpus"] == 16 and out["nics"] == 8 and out["switches"] == 12
    assert out["groups"][0] == [0, 1] and len(out["groups"]) == 8
    assert len(out["relations"]) == 16 and out["relations"][3][3] == "X"
    assert len(out["nic_relations"][0]) == 8 and out["nic_relations"][0][0] == "PIX"
    assert out["paths"]["NET"] == 128


def test_topo_show_files(capsys, fixtures) -> None:
    out = run_json(
        capsys, "topo", "show", str(fixtures / "nvsmi_l40s_4gpu_nic_legend.txt"), "--pcie-gen", "4"
    )
    assert out["gpus"] == 4 and out["relations"][0][1] == "NODE"
    out = run_json(
        capsys, "topo", "show", str(fixtures / "nccl_h200_pex_switches.xml"), "--nodes", "2"
    )
    assert out["gpus"] == 8


def test_topo_convert_round_trip(capsys, tmp_path) -> None:
    target = tmp_path / "r5090.json"
    out = run_json(capsys, "topo", "convert", "r5090-bf3", "--to", "spec", "-o", str(target))
    assert out["output"] == str(target)
    assert spec.read(target) == preset("r5090-bf3")
    again = run_json(capsys, "topo", "show", str(target))
    assert again["fingerprint"] == preset("r5090-bf3").fingerprint
    text = run_json(capsys, "topo", "convert", "fig1", "--to", "nvsmi")["text"]
    nvsmi_file = tmp_path / "fig1.txt"
    nvsmi_file.write_text(text)
    assert (
        run_json(capsys, "topo", "show", str(nvsmi_file))["relations"] == preset("fig1").relations()
    )


def test_errors_are_clear(capsys) -> None:
    assert main(["topo", "show", "no-such-topology"]) == 2
    err = capsys.readouterr().err
    assert "neither a preset" in err and "r5080-bf3" in err
    assert main(["topo", "show", "no-such-topology", "--json"]) == 2
    assert "error" in json.loads(capsys.readouterr().out)


def test_info(capsys) -> None:
    out = run_json(capsys, "info")
    assert out["native"]["ffi_api_version"] == [0, 3]
    assert isinstance(out["cuda"]["device_count"], int)
    if not out["cuda"]["device_count"]:
        assert out["cuda"]["error"]


@pytest.mark.skipif(
    shutil.which("variopath") is None and sys.prefix == sys.base_prefix,
    reason="console script not installed",
)
def test_console_script() -> None:
    exe = shutil.which("variopath") or str(
        __import__("pathlib").Path(sys.executable).parent / "variopath"
    )
    proc = subprocess.run(
        [exe, "topo", "show", "fig1", "--json"], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["gpus"] == 6


def test_run_contract(capsys, tmp_path) -> None:
    saved = tmp_path / "s.json"
    out = run_json(
        capsys,
        "run",
        "--topology",
        "r5080-bf3",
        "--nodes",
        "2",
        "--scheduler",
        "nccl",
        "--workload",
        "moe",
        "--tokens",
        "32",
        "--seed",
        "3",
        "--save-schedule",
        str(saved),
    )
    for key in (
        "scheduler",
        "ranks",
        "total_bytes",
        "completion_s",
        "algbw_gbps",
        "steps",
        "valid",
        "plan_s",
    ):
        assert key in out
    assert out["valid"] and out["ranks"] == 16 and out["steps"] == 1
    again = run_json(
        capsys, "simulate", "--topology", "r5080-bf3", "--nodes", "2", "--schedule", str(saved)
    )
    assert again["completion_s"] == pytest.approx(out["completion_s"])
    # deterministic: the same seed gives the same result
    assert (
        run_json(
            capsys,
            "run",
            "--topology",
            "r5080-bf3",
            "--nodes",
            "2",
            "--scheduler",
            "nccl",
            "--workload",
            "moe",
            "--tokens",
            "32",
            "--seed",
            "3",
        )["total_bytes"]
        == out["total_bytes"]
    )


def test_run_workloads_and_sizes(capsys) -> None:
    z = run_json(
        capsys,
        "run",
        "--topology",
        "fig1",
        "--scheduler",
        "pairwise",
        "--workload",
        "zipf",
        "--bytes-per-rank",
        "1MiB",
        "--skew",
        "0.8",
    )
    assert z["total_bytes"] == 6 << 20
    u = run_json(
        capsys,
        "run",
        "--topology",
        "fig1",
        "--scheduler",
        "nccl",
        "--workload",
        "uniform",
        "--bytes-per-pair",
        "64KiB",
        "--lambda-us",
        "0",
        "--contention",
        "none",
    )
    assert u["contention"] == "none" and u["lambda_us"] == 0
    assert u["total_bytes"] == 30 * (64 << 10)
    s = run_json(
        capsys,
        "run",
        "--topology",
        "r5080-bf3",
        "--scheduler",
        "nccl",
        "--workload",
        "sp",
        "--heads-parallel",
        "4",
    )
    assert s["transfers"] == 2 * 4 * 3


def test_run_bad_inputs(capsys, tmp_path) -> None:
    bad = tmp_path / "neg.csv"
    rows = [[0 if i == j else 5 for j in range(6)] for i in range(6)]
    rows[2][4] = -1
    bad.write_text("\n".join(",".join(map(str, r)) for r in rows))
    assert main(["run", "--topology", "fig1", "--scheduler", "nccl", "--demand", str(bad)]) == 2
    assert "[2][4] = -1 is negative" in capsys.readouterr().err
    small = tmp_path / "small.csv"
    small.write_text("0,1\n1,0\n")
    assert main(["run", "--topology", "fig1", "--scheduler", "nccl", "--demand", str(small)]) == 2
    assert "topology has 6 ranks" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["run", "--topology", "fig1", "--scheduler", "nccl", "--workload", "nope"])
    # a schedule that does not validate
    saved = tmp_path / "s.json"
    run_json(
        capsys,
        "run",
        "--topology",
        "fig1",
        "--scheduler",
        "nccl",
        "--workload",
        "uniform",
        "--save-schedule",
        str(saved),
    )
    data = json.loads(saved.read_text())
    data["steps"][0]["transfers"][0][2] += 1
    saved.write_text(json.dumps(data))
    uniform = tmp_path / "u.npy"
    import numpy as np

    from variopath_jax import workloads

    np.save(uniform, workloads.uniform(6, 1 << 20))
    assert (
        main(["simulate", "--topology", "fig1", "--schedule", str(saved), "--demand", str(uniform)])
        == 2
    )
    assert "invalid schedule" in capsys.readouterr().err


def test_demo(capsys, tmp_path) -> None:
    out = run_json(capsys, "demo", "--tokens", "8", "--out", str(tmp_path))
    assert {r["scheduler"] for r in out["results"]} >= {"nccl", "pairwise"}
    assert all(r["valid"] for r in out["results"])
    assert (tmp_path / f"link_utilisation_{out['best']}.png").stat().st_size > 10_000
    op = out["op"]  # what the op runs: one of the plans its C++ core builds, planning counted
    assert op["plan"] != "phased" and op["plan_s"] > 0 and op["completion_s"] > 0
    assert (
        op["nccl_s"] == next(r for r in out["results"] if r["scheduler"] == "nccl")["completion_s"]
    )


def test_run_passes_planner_and_simulator_options(capsys) -> None:
    """--k-target reaches the planner and --coalesce 0 gives the exact simulation."""
    from variopath_jax import workloads
    from variopath_jax.schedulers import PlanRequest, get_scheduler
    from variopath_jax.sim import FluidSimulator
    from variopath_jax.topology import PathModel

    base = ["run", "--topology", "r5080-bf3", "--workload", "zipf", "--skew", "0.6"]
    # variopath-paper: Algorithm 2 alone (variopath may choose a one-activation paced plan)
    base += ["--bytes-per-rank", str(128 << 20), "--seed", "1", "--scheduler", "variopath-paper"]
    coarse = run_json(capsys, *base, "--k-target", "8", "--granularity", "fixed")
    fine = run_json(capsys, *base, "--k-target", "24", "--granularity", "fixed")
    assert fine["activations"] > coarse["activations"]
    exact = run_json(capsys, *base, "--coalesce", "0", "--scheduler", "nccl")
    topo = preset("r5080-bf3")
    demand = workloads.zipf(8, 0.6, 128 << 20, seed=1)
    schedule = get_scheduler("nccl").plan(PlanRequest(demand, PathModel(topo), 20e-6))
    assert exact["completion_s"] == FluidSimulator(topo, coalesce=0).run(schedule).completion_s
    assert exact["contention"] == "pcie"


def test_plan_with_a_path_profile(capsys, tmp_path) -> None:
    """--path-profile plans with the file's rates: capped NET lanes take longer."""
    profile = tmp_path / "paths.json"
    profile.write_text(
        json.dumps({"format": "variopath-path-profile", "version": 1, "rate_gbs": {"NET": 5.0}})
    )
    base = ["plan", "--topology", "r5080-bf3", "--nodes", "2", "--workload", "zipf"]
    plain = run_json(capsys, *base)
    slow = run_json(capsys, *base, "--path-profile", str(profile))
    assert slow["valid"] and slow["modeled_s"] > plain["modeled_s"]
    assert main([*base, "--path-profile", str(tmp_path / "missing.json")]) != 0
    assert "path profile" in capsys.readouterr().err
