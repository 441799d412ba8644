"""``variopath bench``: suite definitions, summaries, and a small end-to-end run."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from variopath_jax.bench import harness
from variopath_jax.bench.suites import SUITES, resolve
from variopath_jax.bench.summary import geomean, markdown, summarize
from variopath_jax.catalog import CatalogError
from variopath_jax.cli import main
from variopath_jax.errors import VarioPathError
from variopath_jax.topology import PathModel, preset


def _row(scheduler: str, seed: int, completion_s: float, **extra) -> dict:
    row = {
        "suite": "table3",
        "topology": "r5080-bf3",
        "nodes": 2,
        "ranks": 16,
        "tokens": None,
        "mib_per_rank": None,
        "skew": 0.6,
        "seed": seed,
        "scheduler": scheduler,
        "completion_s": completion_s,
        "valid": True,
        "steps": 10,
        "bound_s": 1.0,
        "error": "",
    }
    return row | extra


def test_geomean() -> None:
    assert geomean([2.0, 8.0]) == pytest.approx(4.0)
    assert geomean([0.5]) == pytest.approx(0.5)
    assert math.isnan(geomean([]))


def test_summary_of_hand_made_rows() -> None:
    suite = SUITES["table3"]
    rows = [
        _row("variopath-paper", 0, 2.0),
        _row("variopath-paper", 1, 4.0),
        _row("variopath-fixed-peer", 0, 4.0),  # 2x
        _row("variopath-fixed-peer", 1, 32.0),  # 8x
        _row("variopath-fixed-path", 0, 1.0, steps=1),  # 0.5x: VarioPath loses
        _row("variopath-fixed-path", 1, 8.0, valid=False),  # not matched
        _row("variopath-fixed-both", 0, None, valid=None, error="no catalog: too big"),
        _row("variopath-fixed-both", 1, None, valid=None, error="no catalog: too big"),
    ]
    out = summarize(suite, rows)
    by = {s["system"]: s for s in out["speedups"]}
    peer = by["variopath-fixed-peer"]
    assert peer["points"] == 2 and peer["geomean"] == pytest.approx(4.0)
    assert (peer["min"], peer["max"], peer["wins"], peer["losses"]) == (2.0, 8.0, 2, 0)
    assert peer["paper"] == 2.00 and peer["by_deployment"] == {"r5080-bf3 x2": pytest.approx(4.0)}
    path = by["variopath-fixed-path"]
    assert path["points"] == 1 and path["geomean"] == pytest.approx(0.5) and path["losses"] == 1
    assert by["variopath-fixed-both"]["points"] == 0
    fractions = {b["system"]: b for b in out["bound_fraction"]}
    assert fractions["variopath-paper"]["geomean"] == pytest.approx(math.sqrt(1 / 2 * 1 / 4))
    assert out["points"] == 2 and out["runs"] == 8 and out["failed_runs"] == 3
    errors = {(f["system"], f["error"]): f["runs"] for f in out["failures"]}
    assert errors == {
        ("variopath-fixed-both", "no catalog: too big"): 2,
        ("variopath-fixed-path", "invalid schedule"): 1,
    }
    text = markdown(out, ["table3.png"])
    assert "**VarioPath loses to variopath-fixed-path**: geomean 0.50×" in text
    assert "VarioPath beats variopath-fixed-peer: geomean 4.00×" in text
    # matched points only: the bound fraction of both systems where both ran
    assert (
        "one concurrent step and reaches 100% of the lower bound on these points (VarioPath 50%)"
        in text
    )
    assert "no catalog: too big" in text and "![table3](table3.png)" in text


def test_robust_summary_of_hand_made_rows() -> None:
    """variopath-robust against the best peer at each point and its regret against variopath
    planned for the model, per model."""
    suite = SUITES["fig9"]
    rows = [
        _row(name, seed, t, contention=model)
        for model, times in {
            # seed 0: robust 2 vs best peer 3 (nccl); seed 1: robust 5 vs best peer 4 (fast)
            "pcie": {
                "variopath": (1.0, 4.0),
                "variopath-robust": (2.0, 5.0),
                "nccl": (3.0, 9.0),
                "fast": (6.0, 4.0),
                "railwave": (9.0, 9.0),
            },
            "none": {
                "variopath": (1.0, 1.0),
                "variopath-robust": (1.0, 1.0),
                "nccl": (2.0, 2.0),
                "fast": (2.0, 2.0),
                "railwave": (2.0, 2.0),
            },
        }.items()
        for name, pair in times.items()
        for seed, t in enumerate(pair)
    ]
    out = summarize(suite, rows)
    pcie, none = out["robust"]
    assert (pcie["contention"], none["contention"]) == ("pcie", "none")
    assert pcie["points"] == 2 and pcie["not_slower"] == 1
    assert pcie["vs_best_peer"] == pytest.approx(math.sqrt(3 / 2 * 4 / 5))
    assert pcie["vs_best_peer_min"] == pytest.approx(0.8)
    assert pcie["regret_max"] == pytest.approx(2.0)
    assert pcie["regret_geomean"] == pytest.approx(math.sqrt(2 * 5 / 4))
    assert none["not_slower"] == 2 and none["regret_max"] == pytest.approx(1.0)
    text = markdown(out, [])
    assert "**slower than the best peer on 1/2 points** (worst 0.80×)" in text
    assert "none: variopath-robust (planned without knowing the model) is never slower" in text


def test_suites_mirror_the_paper() -> None:
    assert [s.name for s in resolve(["all"])] == [
        "fig7",
        "fig8",
        "fig9",
        "fig10",
        "steps",
        "table3",
    ]
    assert [s.name for s in resolve(["fig9", "fig8", "fig9"])] == ["fig9", "fig8"]
    with pytest.raises(VarioPathError, match="unknown suite"):
        resolve(["fig11"])
    assert len(SUITES["fig8"].points()) == 80  # the paper's 80 AlltoAll configurations
    assert len(SUITES["fig9"].points()) == 4 * 3 * 5
    assert len(SUITES["table3"].points(seeds=2)) == 2
    assert len(SUITES["fig8"].points(seeds=3)) == 80  # uniform demands have no seed
    for suite in SUITES.values():
        assert suite.systems[0].label == (
            "variopath-paper" if suite.name == "table3" else "variopath"
        )
        full = set(suite.points())
        assert set(suite.points(quick=True)) <= full or suite.name in ("fig10", "steps")
        assert {c.system for c in suite.claims} <= {s.label for s in suite.peers}


def test_fig7_payload_spans_the_range() -> None:
    suite = SUITES["fig7"]
    n = preset("r5080-bf3", 4).num_ranks
    points = [p for p in suite.points() if (p.topology, p.nodes) == ("r5080-bf3", 4)]
    payload = [suite.demand(p, n).sum() / n for p in points]
    assert payload == sorted(payload) and payload[0] < 128 << 10 and payload[-1] > 32 << 20


def test_a_deployment_without_catalog_is_reported(monkeypatch) -> None:
    def failing(*args, **kwargs):
        raise CatalogError("too many profiles")

    monkeypatch.setattr(harness, "catalog_for", failing)
    topo = preset("r5080-bf3", 2)
    assert harness.catalog_error(topo, PathModel(topo)) == "no catalog: too many profiles"


def test_bench_quick_end_to_end(capsys, tmp_path, monkeypatch) -> None:
    # msccl is made to fail: the suite records it and goes on
    real = harness.run_one

    def flaky(model, scheduler, *args, **kwargs):
        if scheduler == "msccl":
            raise RuntimeError("boom")
        return real(model, scheduler, *args, **kwargs)

    monkeypatch.setattr(harness, "run_one", flaky)
    argv = ["bench", "fig8", "table3", "--quick", "--limit", "1", "--out", str(tmp_path), "--json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["quick"] and out["contention"] == ["pcie", "pcie-fair", "none"]
    assert all(n["barrier_s"] > 0 and n["issue_s"] > 0 for n in out["networks"])
    assert [s["suite"] for s in out["suites"]] == ["fig8", "table3"]
    for s in out["suites"]:
        for key in ("points", "runs", "speedups", "bound_fraction", "failures", "wall_s", "files"):
            assert key in s
        d = tmp_path / s["suite"]
        for name in (f"{s['suite']}.csv", f"{s['suite']}.png", "summary.md", "summary.json"):
            assert (d / name).stat().st_size > 0
        assert s["points"] == 1
    fig8, table3 = out["suites"]
    assert fig8["models"] == ["pcie", "pcie-fair", "none"]
    # the three systems under pcie, then under pcie-fair, then under none
    robust, nccl, msccl, _, _, _, robust_ideal, nccl_ideal, _ = fig8["speedups"]
    assert nccl["system"] == "nccl" and nccl["points"] == 1 and nccl["geomean"] > 0
    assert (nccl["contention"], nccl_ideal["contention"]) == ("pcie", "none")
    assert nccl_ideal["system"] == "nccl" and nccl_ideal["geomean"] > 0
    assert msccl["points"] == 0 and msccl["geomean"] is None
    # variopath-robust's row is its regret against variopath planned for the model: >= 1
    assert robust["system"] == robust_ideal["system"] == "variopath-robust"
    assert robust["points"] == 1 and robust["geomean"] >= 1 - 1e-12
    assert [r["contention"] for r in fig8["robust"]] == ["pcie", "pcie-fair", "none"]
    assert all(r["points"] == 1 and r["regret_max"] >= 1 - 1e-12 for r in fig8["robust"])
    assert fig8["failures"] == [
        {"deployment": "r5080-bf3 x1", "system": "msccl", "error": "RuntimeError: boom", "runs": 3}
    ]
    assert all(s["geomean"] > 0 for s in table3["speedups"])
    assert 0 < table3["bound_fraction"][0]["geomean"] <= 1
    header = (tmp_path / "fig8" / "fig8.csv").read_text().splitlines()[0].split(",")
    assert header == list(harness.CSV_COLUMNS)
    combined = (tmp_path / "summary.md").read_text()
    assert "## fig8" in combined and "## table3" in combined and "(fig8/fig8.png)" in combined
    assert "| nccl | pcie |" in combined and "| nccl | none |" in combined
    assert "| nccl | pcie-fair |" in combined and "variopath-robust (planned without" in combined
    # benchmarks/bench_comm.py reads the run: one row per model, communication only
    comm = subprocess.run(
        [
            sys.executable,
            str(Path(__file__).parents[1] / "benchmarks" / "bench_comm.py"),
            str(tmp_path),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    rows = json.loads(comm.stdout)
    assert [(r["suite"], r["model"]) for r in rows] == [
        ("fig8", "pcie"),
        ("fig8", "pcie-fair"),
        ("fig8", "none"),
    ]
    assert all(r["points"] == 1 and r["robust_regret_max"] >= 1 - 1e-12 for r in rows)


def test_the_steps_suite_follows_a_moving_trace() -> None:
    """Each point of ``steps`` is one step of the same seeded trace: its dispatch demand, which
    changes from step to step."""
    from variopath_jax.bench.suites import TRACE_TOKEN_BYTES, Point
    from variopath_jax.traces import moving_trace

    suite = SUITES["steps"]
    trace = moving_trace(11, 16, 128, experts=256, top_k=8, seed=0)
    for step in (0, 10):
        got = suite.demand(Point("r5080-cx8", 2, float(step)), 16)
        np.testing.assert_array_equal(got, trace.demand(step, TRACE_TOKEN_BYTES))
        assert suite.params(Point("r5080-cx8", 2, float(step)))["step"] == step
    assert not np.array_equal(trace.demand(0, 1), trace.demand(10, 1))
